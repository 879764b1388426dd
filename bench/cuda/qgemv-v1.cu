// Quantized GEMV over raw GGUF blocks: out[m, r] (+)= sum_k W[r, k] * x[m, k] for W stored in
// the exact ggml layouts, x bf16 [M, K] (M <= MT, a template bound), f32 accumulation.
//
// - Q8_0 block (34 bytes): f16 d, 32 x int8 q; w = q * d.
// - Q4_K super-block (144 bytes, 256 values): f16 d, f16 dmin, 12 bytes of 6-bit scales and
//   mins (get_scale_min_k4), 128 bytes of nibbles: byte 32h + l holds element 64h + l (low
//   nibble) and 64h + 32 + l (high nibble); w = d*sc_j * q - dmin*m_j, sub-block j = e / 32.
// Dequantized values are exactly the CPU dequantizer's (all products are exact in f32 and the
// one subtraction rounds once either way), so the GEMV differs from the CPU reference only
// by f32 summation order.
//
// Launch: block 256 (8 warps). A CTA covers 8 / ksplit row groups of R rows; the ksplit warps
// of a group split the row's K range (chunk by chunk) and their partial sums are added in a
// fixed order through shared memory, so results are deterministic. Ints stay int-exact: a
// byte q becomes float by byte-permuting it under the exponent of 2^23 and subtracting 2^23
// (no int-to-float conversion instruction, which runs at 1/8 rate).
//
// Q8_0 rows start wherever 34-byte blocks put them (2-byte aligned), so each warp stages a
// chunk of 32 blocks per row through shared memory with aligned 16-byte loads (from the row
// start rounded down to 16; the weight buffer must be padded to a multiple of 16 bytes).
// Q4_K rows are 144-byte multiples (16-byte aligned): lanes read header and quants straight
// from global memory, 8 lanes per super-block, one 16-byte load of quants each.

#define QG_WARPS 8
#define Q8_STAGE 70  // uint4 per staged Q8_0 row chunk: (15 + 32*34 + 12) / 16 rounded up

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("{.reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t;}" : "=f"(f) : "h"(h));
    return f;
}

// Byte i of w (0..255) as the float 2^23 + byte.
__device__ __forceinline__ float byte_f(unsigned w, int i) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + i));
}

// Four int8 values of w -> exact floats.
__device__ __forceinline__ void i8x4(unsigned w, float* f) {
    w ^= 0x80808080u;  // q + 128 as an unsigned byte
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = byte_f(w, i) - 8388736.f;  // 2^23 + 128
}

// Four nibbles (one per byte of w & 0x0f0f0f0f) -> exact floats.
__device__ __forceinline__ void u4x4(unsigned w, float* f) {
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = byte_f(w, i) - 8388608.f;  // 2^23
}

// 8 bf16 (a uint4) -> f32.
__device__ __forceinline__ void bf16x8(uint4 v, float* f) {
    unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 ldg16(const void* p) {
    return __ldg((const uint4*)p);
}

// Byte i (0..11) of the Q4_K scales (header words y, z, w).
__device__ __forceinline__ unsigned q4k_sbyte(uint4 hd, int i) {
    unsigned wd = i < 4 ? hd.y : (i < 8 ? hd.z : hd.w);
    return (wd >> ((i & 3) * 8)) & 0xffu;
}

// ggml's get_scale_min_k4 for sub-block j (0..7).
__device__ __forceinline__ void q4k_scale_min(uint4 hd, int j, float& sc, float& mn) {
    unsigned s, m;
    if (j < 4) {
        s = q4k_sbyte(hd, j) & 63u;
        m = q4k_sbyte(hd, j + 4) & 63u;
    } else {
        s = (q4k_sbyte(hd, j + 4) & 0xfu) | ((q4k_sbyte(hd, j - 4) >> 6) << 4);
        m = (q4k_sbyte(hd, j + 4) >> 4) | ((q4k_sbyte(hd, j) >> 6) << 4);
    }
    sc = (float)s;
    mn = (float)m;
}

// Sums each warp's MT*R partials, then the ksplit warps of a row group in order; writes out.
template <int MT, int R>
__device__ __forceinline__ void qg_finish(float (&acc)[MT][R], float (*red)[MT * R], int row0g,
                                          int rows, int mrun, int ksplit, int accumulate,
                                          float* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = warp_sum(acc[m][r]);
            if (lane == 0) red[warp][m * R + r] = v;
        }
    __syncthreads();
    const int groups = QG_WARPS / ksplit;
    for (int i = threadIdx.x; i < groups * MT * R; i += blockDim.x) {
        int g = i / (MT * R), mr = i % (MT * R), m = mr / R, r = mr % R;
        float s = 0.f;
        for (int p = 0; p < ksplit; p++) s += red[g * ksplit + p][mr];
        int row = row0g + g * R + r;
        if (m < mrun && row < rows) {
            float* o = out + (i64)m * rows + row;
            *o = accumulate ? *o + s : s;
        }
    }
}

template <int MT, int R>
__device__ __forceinline__ void q8_0_gemv(const unsigned char* __restrict__ w,
                                          const bf16* __restrict__ x, float* __restrict__ out,
                                          int rows, int k, int mrun, int ksplit, int accumulate) {
    __shared__ __align__(16) uint4 stage[QG_WARPS][R][Q8_STAGE];
    __shared__ float red[QG_WARPS][MT * R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int groups = QG_WARPS / ksplit;
    const int g = warp / ksplit, part = warp % ksplit;
    const int row0g = blockIdx.x * groups * R;
    const int row0 = row0g + g * R;
    const int nb = k >> 5;
    const i64 rb = (i64)nb * 34;
    const int chunks = (nb + 31) >> 5;
    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[m][r] = 0.f;
    for (int c = part; c < chunks; c += ksplit) {
        const int cb = min(32, nb - c * 32);
        int shift[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = min(row0 + r, rows - 1);  // rows past the end: computed, not stored
            unsigned long long a = (unsigned long long)(w + row * rb + (i64)c * 1088);
            const uint4* base = (const uint4*)(a & ~15ull);
            shift[r] = (int)(a & 15ull);
            const int n16 = (shift[r] + cb * 34 + 15) >> 4;
            for (int i = lane; i < n16; i += 32) stage[warp][r][i] = ldg16(base + i);
        }
        __syncwarp();
        const int piece = lane & 3;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int b = j * 8 + (lane >> 2);
            if (b < cb) {
                float q[R][8], d[R];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const unsigned char* s = (const unsigned char*)stage[warp][r];
                    const int o = shift[r] + 34 * b;  // even
                    d[r] = h2f(*(const unsigned short*)(s + o));
                    const int qo = o + 2 + 8 * piece;
                    const unsigned* wp = (const unsigned*)(s + (qo & ~3));
                    const int sh = (qo & 3) * 8;
                    i8x4(__funnelshift_r(wp[0], wp[1], sh), q[r]);
                    i8x4(__funnelshift_r(wp[1], wp[2], sh), q[r] + 4);
                }
                const i64 kx = (i64)c * 1024 + 256 * j + 8 * lane;
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m < mrun) {
                        float xf[8];
                        bf16x8(ldg16(x + (i64)m * k + kx), xf);
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            float s = 0.f;
#pragma unroll
                            for (int i = 0; i < 8; i++) s = fmaf(q[r][i], xf[i], s);
                            acc[m][r] = fmaf(d[r], s, acc[m][r]);
                        }
                    }
                }
            }
        }
        __syncwarp();
    }
    qg_finish<MT, R>(acc, red, row0g, rows, mrun, ksplit, accumulate, out);
}

template <int MT, int R>
__device__ __forceinline__ void q4_k_gemv(const unsigned char* __restrict__ w,
                                          const bf16* __restrict__ x, float* __restrict__ out,
                                          int rows, int k, int mrun, int ksplit, int accumulate) {
    __shared__ float red[QG_WARPS][MT * R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int groups = QG_WARPS / ksplit;
    const int g = warp / ksplit, part = warp % ksplit;
    const int row0g = blockIdx.x * groups * R;
    const int row0 = row0g + g * R;
    const int nsb = k >> 8;
    const i64 rb = (i64)nsb * 144;
    const int steps = (nsb + 3) >> 2;
    const int sl = lane >> 3, j = lane & 7, h = j >> 1;
    const int e0 = 64 * h + 16 * (j & 1);  // first low-nibble element of this lane
    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[m][r] = 0.f;
    for (int st = part; st < steps; st += ksplit) {
        const int sb = st * 4 + sl;
        if (sb >= nsb) continue;
        uint4 hd[R], qs[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = min(row0 + r, rows - 1);
            const unsigned char* blk = w + row * rb + (i64)sb * 144;
            hd[r] = ldg16(blk);
            qs[r] = ldg16(blk + 16 + 16 * j);
        }
        float d1[R], m1[R], d2[R], m2[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float d = h2f((unsigned short)(hd[r].x & 0xffffu));
            const float dm = h2f((unsigned short)(hd[r].x >> 16));
            float sc, mn;
            q4k_scale_min(hd[r], 2 * h, sc, mn);
            d1[r] = d * sc;
            m1[r] = dm * mn;
            q4k_scale_min(hd[r], 2 * h + 1, sc, mn);
            d2[r] = d * sc;
            m2[r] = dm * mn;
        }
        const i64 kb = (i64)sb * 256 + e0;
#pragma unroll
        for (int p = 0; p < 2; p++) {  // quant words 2p, 2p+1: elements e0 + 8p .. + 8
            float lo[R][8], hi[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const unsigned wa = p ? qs[r].z : qs[r].x, wb = p ? qs[r].w : qs[r].y;
                float t[8];
                u4x4(wa & 0x0f0f0f0fu, t);
                u4x4(wb & 0x0f0f0f0fu, t + 4);
#pragma unroll
                for (int i = 0; i < 8; i++) lo[r][i] = fmaf(d1[r], t[i], -m1[r]);
                u4x4((wa >> 4) & 0x0f0f0f0fu, t);
                u4x4((wb >> 4) & 0x0f0f0f0fu, t + 4);
#pragma unroll
                for (int i = 0; i < 8; i++) hi[r][i] = fmaf(d2[r], t[i], -m2[r]);
            }
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m < mrun) {
                    float xl[8], xh[8];
                    bf16x8(ldg16(x + (i64)m * k + kb + 8 * p), xl);
                    bf16x8(ldg16(x + (i64)m * k + kb + 32 + 8 * p), xh);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float s = acc[m][r];
#pragma unroll
                        for (int i = 0; i < 8; i++) s = fmaf(lo[r][i], xl[i], s);
#pragma unroll
                        for (int i = 0; i < 8; i++) s = fmaf(hi[r][i], xh[i], s);
                        acc[m][r] = s;
                    }
                }
            }
        }
    }
    qg_finish<MT, R>(acc, red, row0g, rows, mrun, ksplit, accumulate, out);
}

// Kernels qgemv_<type>_m<MT>r<R>(w, x, out, rows, k, m, ksplit, accumulate):
// grid (ceil(rows / (8 / ksplit * R))), block 256; m <= MT; ksplit in {1, 2, 4, 8}.
#define QGEMV_KERNEL(TY, MT, R)                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                        \
        qgemv_##TY##_m##MT##r##R(const unsigned char* w, const bf16* x, float* out, int rows, \
                                 int k, int m, int ksplit, int accumulate) {                  \
        TY##_gemv<MT, R>(w, x, out, rows, k, m, ksplit, accumulate);                          \
    }

QGEMV_KERNEL(q8_0, 1, 1)
QGEMV_KERNEL(q8_0, 1, 2)
QGEMV_KERNEL(q8_0, 1, 4)
QGEMV_KERNEL(q8_0, 2, 2)
QGEMV_KERNEL(q8_0, 4, 2)
QGEMV_KERNEL(q8_0, 8, 1)
QGEMV_KERNEL(q8_0, 8, 2)
QGEMV_KERNEL(q4_k, 1, 1)
QGEMV_KERNEL(q4_k, 1, 2)
QGEMV_KERNEL(q4_k, 1, 4)
QGEMV_KERNEL(q4_k, 2, 2)
QGEMV_KERNEL(q4_k, 4, 2)
QGEMV_KERNEL(q4_k, 8, 1)
QGEMV_KERNEL(q4_k, 8, 2)

// Q8_0 rows [rows, k] -> bf16 [rows, k] (round to nearest even of the exact value).
// One thread per block, grid-stride; reads the block as 17 aligned u16 (blocks are 2-aligned).
extern "C" __global__ void dequant_q8_0_bf16(const unsigned char* w, bf16* out, int rows,
                                             int k) {
    const int nb = k >> 5;
    const i64 total = (i64)rows * nb;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const unsigned short* b = (const unsigned short*)(w + i * 34);  // row * rb + bi * 34
        const float d = h2f(b[0]);
        unsigned o[16];
#pragma unroll
        for (int t = 0; t < 16; t++) {
            unsigned v = b[1 + t];
            float lo = (float)(signed char)(v & 0xffu) * d;
            float hi = (float)(signed char)(v >> 8) * d;
            o[t] = (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
        }
        uint4* dst = (uint4*)(out + i * 32);
#pragma unroll
        for (int t = 0; t < 4; t++) dst[t] = make_uint4(o[4 * t], o[4 * t + 1], o[4 * t + 2], o[4 * t + 3]);
    }
}

// Q4_K rows [rows, k] -> bf16 [rows, k]. One thread per (super-block, lane j of 8): 16 low-
// and 16 high-nibble elements, as in the GEMV; grid-stride.
extern "C" __global__ void dequant_q4_k_bf16(const unsigned char* w, bf16* out, int rows, int k) {
    const int nsb = k >> 8;
    const i64 total = (i64)rows * nsb * 8;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 sb = i >> 3;  // super-blocks are contiguous over rows
        const int j = (int)(i & 7), h = j >> 1;
        const unsigned char* blk = w + sb * 144;
        const uint4 hd = ldg16(blk), qs = ldg16(blk + 16 + 16 * j);
        const float d = h2f((unsigned short)(hd.x & 0xffffu));
        const float dm = h2f((unsigned short)(hd.x >> 16));
        float sc, mn;
        q4k_scale_min(hd, 2 * h, sc, mn);
        const float d1 = d * sc, m1 = dm * mn;
        q4k_scale_min(hd, 2 * h + 1, sc, mn);
        const float d2 = d * sc, m2 = dm * mn;
        const unsigned q[4] = {qs.x, qs.y, qs.z, qs.w};
        unsigned lo[8], hi[8];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            float a[4], b[4];
            u4x4(q[t] & 0x0f0f0f0fu, a);
            u4x4((q[t] >> 4) & 0x0f0f0f0fu, b);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                lo[2 * t + u] = (unsigned)f2bf(fmaf(d1, a[2 * u], -m1)) |
                                ((unsigned)f2bf(fmaf(d1, a[2 * u + 1], -m1)) << 16);
                hi[2 * t + u] = (unsigned)f2bf(fmaf(d2, b[2 * u], -m2)) |
                                ((unsigned)f2bf(fmaf(d2, b[2 * u + 1], -m2)) << 16);
            }
        }
        bf16* o = out + sb * 256 + 64 * h + 16 * (j & 1);
        uint4* ol = (uint4*)o;
        uint4* oh = (uint4*)(o + 32);
        ol[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        ol[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
        oh[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        oh[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    }
}
