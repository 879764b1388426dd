// GGUF weights kept compressed on the GPU (Q8_0, Q4_K), and matrix-vector products over them
// with int8 dot products (dp4a), the scheme of llama.cpp's MMVQ:
//
// - x (bf16 [M, K]) is quantized per 32 values (q8_block, in each GEMV block's shared
//   memory; q8_quantize_x for tests and other users): d = amax / 127,
//   q = round(x / d) (ggml's quantize_row_q8_0 rule: q = roundf(x * (1 / d))), with d and
//   s = d * sum(q) kept in f32. The CPU executor quantizes activations the same way for
//   quantized weights, so the GEMV's only difference from the exact product of the stored
//   weights and the quantized x is f32 summation order.
// - Q8_0 (32 values: f16 d + 32 int8) is stored repacked for aligned 16-byte loads: the int8
//   quants as a [rows, K] matrix, then the f16 scales as a [rows, K / 32] matrix (offset
//   rows * K); the same 34 bytes per 32 values as ggml's blocks. w = q * d.
// - Q4_K (256 values in 144 bytes, rows 16-byte aligned) stays in ggml's layout: f16 d,
//   f16 dmin, 12 bytes of 6-bit scales/mins (get_scale_min_k4), 128 bytes of nibbles; byte
//   32h + l holds element 64h + l (low nibble) and 64h + 32 + l (high nibble);
//   w = d*sc_j * q - dmin*m_j for sub-block j = e / 32.
//
// Per 32 weights a lane does ~8 dp4a and a few float ops (vs ~5 float instructions per weight
// with f32 arithmetic, which bound the previous version at 0.4-0.7x of bf16 bandwidth).
//
// Every kernel is deterministic: a warp owns its rows and sums its lanes in a fixed order.

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

__device__ __forceinline__ int dp4a4(uint4 a, uint4 b, int c) {
    c = __dp4a((int)a.x, (int)b.x, c);
    c = __dp4a((int)a.y, (int)b.y, c);
    c = __dp4a((int)a.z, (int)b.z, c);
    return __dp4a((int)a.w, (int)b.w, c);
}

// dp4a of four unsigned bytes of a (0..255) with four signed bytes of b, plus c.
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The high nibbles of q in place (16 * nibble, one per byte) against x: 16 times the dot
// product of the nibbles, one mask a word instead of a shift and a mask.
__device__ __forceinline__ int dp4a4_hi16(uint4 q, uint4 x, int c) {
    c = dp4a_us(q.x & 0xf0f0f0f0u, (int)x.x, c);
    c = dp4a_us(q.y & 0xf0f0f0f0u, (int)x.y, c);
    c = dp4a_us(q.z & 0xf0f0f0f0u, (int)x.z, c);
    return dp4a_us(q.w & 0xf0f0f0f0u, (int)x.w, c);
}

__device__ __forceinline__ uint4 nib_lo(uint4 q) {
    return make_uint4(q.x & 0x0f0f0f0fu, q.y & 0x0f0f0f0fu, q.z & 0x0f0f0f0fu, q.w & 0x0f0f0f0fu);
}

// One 32-value block of x (bf16, 16-byte aligned) quantized by one thread: 32 int8 to `q`
// (16-byte aligned), the scale d and d * sum(q). d = amax / 127, q = roundf(x * (1 / d))
// (ggml's quantize_row_q8_0 rule).
__device__ __forceinline__ void q8_block(const bf16* x, signed char* q, float& d, float& ds) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 u = *(const uint4*)(x + 8 * i);
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
            v[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    int s = 0;
    unsigned packed[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        unsigned p = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int qi = (int)roundf(v[4 * i + j] * id);
            s += qi;
            p |= ((unsigned)qi & 0xffu) << (8 * j);
        }
        packed[i] = p;
    }
    ((uint4*)q)[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    ((uint4*)q)[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    ds = d * (float)s;
}

// q8_block's rule over the nb blocks of one row x, four lanes a block (8 values each; the
// amax and the integer sum through shuffles, order-free): the same bytes and floats as
// q8_block, a quarter of its serial chain a thread. Every thread of the block calls it. (Lab:
// the bulk kernels' QCOOP; one load a round measured 1.6-3 µs slower than q8_block at K =
// 7,168-18,432 in session 16, so the loads of U rounds go first.)
__device__ __forceinline__ void q8_coop(const bf16* x, int nb, signed char* xq, float* xd,
                                        float* xs) {
    // U blocks a thread at once, their loads first (one round trip per U, not per block)
    constexpr int U = 4;
    const int part = threadIdx.x & 3, nt = blockDim.x >> 2, lb = (threadIdx.x & 31) >> 2;
    for (int c0 = (threadIdx.x >> 2) - lb; c0 < nb; c0 += U * nt) {  // c0: the warp's first block
        uint4 us[U];
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int b = c0 + i * nt + lb;
            us[i] = b < nb ? *(const uint4*)(x + b * 32 + 8 * part) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < U; i++) {
            if (c0 + i * nt >= nb) break;  // warp-uniform: the warp's first block of round i
            const int b = c0 + i * nt + lb;
            const bool live = b < nb;
            float v[8];
            const uint4 u = us[i];
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                v[2 * j] = __uint_as_float(w[j] << 16);
                v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
            float amax = 0.f;
#pragma unroll
            for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[e]));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            const float d = amax / 127.f;
            const float id = d > 0.f ? 1.f / d : 0.f;
            int sum = 0;
            unsigned p[2] = {0, 0};
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int qi = (int)roundf(v[e] * id);
                sum += qi;
                p[e >> 2] |= ((unsigned)qi & 0xffu) << (8 * (e & 3));
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (live) {
                *(uint2*)(xq + b * 32 + 8 * part) = make_uint2(p[0], p[1]);
                if (part == 0) {
                    xd[b] = d;
                    xs[b] = d * (float)sum;
                }
            }
        }
    }
}

// x bf16 [blocks * 32] (rows of K back to back, K % 32 == 0) -> xq int8, xd f32 (scale) and
// xs f32 (scale * sum of the block's q) per 32 values. A thread per block; grid-stride.
extern "C" __global__ void q8_quantize_x(const bf16* x, i64 blocks, signed char* xq, float* xd,
                                         float* xs) {
    MLA_PDL();
    for (i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x; b < blocks;
         b += (i64)gridDim.x * blockDim.x)
        q8_block(x + b * 32, xq + b * 32, xd[b], xs[b]);
}

#define QT_Q8_0 1
#define QT_Q4_K 2

// Q4_K: d * scale and dmin * min of sub-blocks 2h and 2h + 1 from a super-block header
// (ggml's get_scale_min_k4 on a byte pair at once, as llama.cpp's dot product does).
__device__ __forceinline__ void q4k_pair(uint4 hd, int h, float& d0, float& d1, float& m0,
                                         float& m1) {
    const int sh = 16 * (h & 1);
    const unsigned y = (hd.y >> sh) & 0xffffu, z = (hd.z >> sh) & 0xffffu,
                   w = (hd.w >> sh) & 0xffffu;
    const unsigned sc = h < 2 ? (y & 0x3f3fu) : ((w & 0x0f0fu) | ((y >> 2) & 0x3030u));
    const unsigned mn = h < 2 ? (z & 0x3f3fu) : (((w >> 4) & 0x0f0fu) | ((z >> 2) & 0x3030u));
    const float d = h2f((unsigned short)(hd.x & 0xffffu));
    const float dm = h2f((unsigned short)(hd.x >> 16));
    d0 = d * (byte_f(sc, 0) - 8388608.f);  // byte_f - 2^23: the 6-bit value, exactly
    d1 = d * (byte_f(sc, 1) - 8388608.f);
    m0 = dm * (byte_f(mn, 0) - 8388608.f);
    m1 = dm * (byte_f(mn, 1) - 8388608.f);
}

// The bulk walk's (BULK) copies: an mbarrier a slot, one arrival (the issuing lane's)
// and the bytes of the step's copies as its transaction count.
__device__ __forceinline__ void qmv_bar_init(unsigned long long* bar, int n) {
#if __CUDA_ARCH__ >= 900
    for (int i = 0; i < n; i++) {
        const unsigned a = (unsigned)__cvta_generic_to_shared(bar + i);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void qmv_bar_wait(unsigned long long* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
    const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile(
        "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra W;\n}" ::"r"(a), "r"(parity) : "memory");
#endif
}

// Super-blocks sb0 .. sb0 + n of each of R rows (bases lw) into dst (8 * 144 bytes a row),
// completing on bar.
template <int R>
__device__ __forceinline__ void qmv_bulk_step(unsigned char* dst, const unsigned char* const* lw,
                                              int sb0, int n, unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar), bytes = (unsigned)n * 144u;
    // the warp's reads of the slot's last contents (ordered by the __syncwarp before) come
    // before the async proxy's writes
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(R * bytes)
                 : "memory");
#pragma unroll
    for (int r = 0; r < R; r++) {
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst + r * 8 * 144);
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(d), "l"(lw[r] + (i64)sb0 * 144), "r"(bytes), "r"(b)
            : "memory");
    }
#endif
}

// One step of a warp's walk: the weights one lane loads (R rows, NQ 16-byte words of quants
// each), requested DEPTH steps before the step that uses them is computed.
template <int TY, int R, int NQ>
struct QmvStep {
    uint4 q[R][NQ];
    uint4 hd[R];  // Q4_K header; Q8_0: .x holds the f16 scale
};

// A lane's loads of one step of qmv_t's walk: step ls of R rows (bases lw, Q8_0 scales lwd)
// of width k into st; nothing past the row's end.
// - Q8_0: 16 * NQ quants and their scale from column ls * 512 NQ + lane * 16 NQ;
// - Q4_K: super-block ls * (4 NQ) + lane / (8 / NQ) (8 / NQ lanes a super-block); its
//   header, and the 16 NQ bytes of sub-blocks 2h, 2h + 1 at byte lo of the pair.
template <int TY, int R, int NQ>
__device__ __forceinline__ void qmv_load_step(QmvStep<TY, R, NQ>& st,
                                              const unsigned char* const* lw,
                                              const unsigned short* const* lwd, int ls, int lane,
                                              int k) {
    constexpr int QV = 16 * NQ, LPS = 8 / NQ, SPS = 32 / LPS;
    const int il = lane % LPS, h = NQ == 2 ? il : il >> 1, lo = NQ == 2 ? 0 : (il & 1) * 16;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if constexpr (TY == QT_Q8_0) {
            const int c = ls * 32 * QV + lane * QV;
            if (c < k) {  // k % 32 == 0: all QV quants are in the row
#pragma unroll
                for (int j = 0; j < NQ; j++) st.q[r][j] = ldg16(lw[r] + c + 16 * j);
                st.hd[r].x = __ldg(lwd[r] + (c >> 5));
            }
        } else {
            const int sb = ls * SPS + lane / LPS;
            if (sb < (k >> 8)) {
                const unsigned char* blk = lw[r] + sb * 144;
                st.hd[r] = ldg16(blk);
#pragma unroll
                for (int j = 0; j < NQ; j++)
                    st.q[r][j] = ldg16(blk + 16 + 32 * h + lo + 16 * j);
            }
        }
    }
}

// The dense GEMV's x made from the f32 rows xf [.., k] (rows xr .. xr + nv) by the RMSNorm
// with gamma, as rms_norm makes hnb (rms_inv_8's sums, (x * inv) * gamma rounded to bf16: the
// same bits), staged in xn (k bf16 of shared memory, then red: 32 floats for the block sum —
// dynamic, since static shared memory beside the bulk kernels' opt-in maximum fails their
// launch), then quantized by q8_block as from hnb: so the product is bit for bit rms_norm then
// the plain GEMV. Block 0 also stores the rows in hnb (if non-null) for the launches after
// this one. Every thread of the block calls it.
__device__ __forceinline__ void qmv_norm_x(const float* xf, const float* gamma, float eps,
                                           bf16* hnb, int xr, int nv, int k, signed char* xq,
                                           float* xd, float* xs, bf16* xn) {
    float* red = (float*)(xn + k);
    const int nt = blockDim.x, nb = k >> 5;
    for (int v = 0; v < nv; v++) {
        const float* row = xf + (i64)(xr + v) * k;
        const float inv = rms_inv_8(row, k, eps, red);
        for (int i = threadIdx.x; i < k; i += nt) {
            const bf16 b = f2bf(row[i] * inv * gamma[i]);
            xn[i] = b;
            if (hnb != nullptr && blockIdx.x == 0) hnb[(i64)(xr + v) * k + i] = b;
        }
        __syncthreads();
        for (int b = threadIdx.x; b < nb; b += nt)
            q8_block(xn + b * 32, xq + v * k + b * 32, xd[v * nb + b], xs[v * nb + b]);
        __syncthreads();  // xn is restaged for the next vector
    }
}

// Largest K of the GEMV (x quantized in shared memory: K + K / 4 bytes a vector).
#define QMV_MAX_K 32768

// Matrix-vector products over quantized weights against x quantized per 32 values:
// out[v, row] (+)= sum_k W[row, k] * xq[v, k] * xd[v, k / 32] for the vectors v < nv.
//
// Dense (ids == null): W at w0; the nv = m (<= MT) vectors are x rows x_div .. x_div + m;
// out rows 0 .. m.
// GLU (the `_glu` kernels; R == 2, W a gate|up [2 glu, k]): act[v, i] = bf16(silu(g) * u)
// of g = row i and u = row glu + i, as silu_mul_bf16 computes it from those rows' sums (bit
// for bit), in place of out: a warp's row group is that row pair, so the SwiGLU needs no
// launch.
// Combine (the `_comb` kernels; dense, MT == 1, 1 <= ck <= 32): out[v, row] = (out[v, row]
// + c) + sum, of c = sum_j cw[v * ck + j] * cy[(v * ck + j) * rows + row] in j's order —
// moe_combine_pairs's weighted sum of token v's ck expert rows cy (bit for bit), then this
// product added as the accumulating GEMV adds it: the routed experts' combine rides on the
// shared expert's down projection (executor/moe.rs), one launch fewer. Lane j loads slot j.
// (With the code in every kernel, steps measured up to 10% slower in session 15: twins.)
// Pairs (ids != null, m == 1): blockIdx.y is pair p; W is expert ids[p] - first's matrix
// (w_ptrs; a pair whose expert is not held here, or has no pointer, gets zeros), x row
// p / x_div, out row p. SLICES (GLU over pairs, the two-CTA `_w_glu` kernels only: at three
// CTAs an SM the slice's up offset spilled the 80 registers in the loop): id sl_from + j is
// the shared expert's slice j (ops.rs's SliceViews; weights.rs): W points at row j * glu of
// the shared [2 sl_up, k] gate|up (Q8_0: its quants; the scales found after the shared
// matrix's rows), the slice's up rows sl_up rows further.
//
// Each block first quantizes its x rows into shared memory (q8_block, the rule of
// q8_quantize_x), so no separate launch or global round trip is needed, and every weight
// loaded serves all nv vectors.
// NORM (the `_norm` twins, dense, one vector: Gpu::qmv_norm): x is made in the kernel from
// f32 rows xf by the RMSNorm with gamma (qmv_norm_x) — bit for bit rms_norm's bf16 rows,
// which block 0 also leaves in hnb — so the attention's norm needs no launch of its own; and
// a second matrix w1 [rows1, k] (rows1 > 0) of the same type and width runs on the same x in
// the same launch, its row groups after the first's, into out1 (kv_a beside q_a / q_proj).
// Persistent: block 256 (8 warps), grid.x at most the CTAs resident at once. A warp walks
// row groups of R rows, in each every K step, with the weights of the next DEPTH steps in
// flight while it computes one (across row groups too), the first ones requested before x is
// quantized and, dense, before the wait on the previous
// grid (weights are never written by a kernel; a pair's matrix comes from the routing's ids,
// so the pairs wait first, unless the host vouches that their ids are final: accumulate bit
// 1, in qmv_t's body). A lane's share of a step is NQ 16-byte words of
// quants a row:
// - Q8_0: 16 * NQ quants (one scale), 512 * NQ a warp;
// - Q4_K: NQ = 1, a quarter of the nibbles of sub-blocks 2h, 2h + 1 (8 lanes a super-block,
//   4 super-blocks a warp); NQ = 2, all 32 bytes of the pair (4 lanes a super-block, 8 a
//   warp), so the 16-byte header each lane loads and decodes serves 64 weights, not 32.
// Warp gw of the grid walks the row groups gw, gw + nw, ... (nw warps in the grid). (Drawing
// each next group from one atomic counter instead, to even out the tail, measured up to 1.8x
// slower on the MLP shapes in session 9, and never faster by more than 1%.) A warp owns its
// rows and sums its lanes in a fixed order.
template <int TY, int R, int MT, int DEPTH, int NQ, bool GLU = false, bool LOADS_ONLY = false,
          bool COMB = false, bool BULK = false, bool QCOOP = false, bool NORM = false,
          bool SLICES = false>
__device__ __forceinline__ void qmv_t(const unsigned long long* __restrict__ w_ptrs,
                                      unsigned long long w0, int first, int held,
                                      const int* __restrict__ ids, const bf16* __restrict__ x,
                                      int x_div, int rows, int k, int m, int accumulate,
                                      float* __restrict__ out, int glu, bf16* __restrict__ act,
                                      const float* __restrict__ cy, const float* __restrict__ cw,
                                      int ck, int sl_from = 0x7fffffff, int sl_up = 0,
                                      const float* __restrict__ xf = nullptr,
                                      const float* __restrict__ gamma = nullptr, float eps = 0.f,
                                      bf16* __restrict__ hnb = nullptr,
                                      unsigned long long w1 = 0, int rows1 = 0,
                                      float* __restrict__ out1 = nullptr) {
    extern __shared__ __align__(16) unsigned char qmv_smem[];
    // vector v: xq [k] at v * k, then xd [MT][k / 32], xs [MT][k / 32]
    signed char* xq = (signed char*)qmv_smem;
    float* xd = (float*)(qmv_smem + MT * k);
    float* xs = xd + MT * (k >> 5);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * 8 + warp, nw = gridDim.x * 8;
    int xr = x_div, orow = 0, nv = min(m, MT);
    int uo = glu;               // GLU: up rows uo rows after the gate rows
    i64 wdo = (i64)rows * k;    // Q8_0: the scales' byte offset from w
    const unsigned char* w = (const unsigned char*)w0;
    // Pairs with accumulate bit 1 (the host vouches, Gpu::qmv_pairs_after): ids are final
    // before this grid's wait — every block of each kernel since the one that wrote them waited
    // before letting the next in — so the matrix is looked up (ids through L2) and its first
    // steps requested before the wait, as a dense product's are (common.cuh's third
    // exception). x, and every store, come after the wait.
    const bool early = ids != nullptr && (accumulate & 2);
    accumulate &= 1;
    if (ids != nullptr) {
        if (!early) MLA_PDL();  // the routing's ids pick the matrix
        const int p = blockIdx.y, id = (early ? ld_cg_s32(ids + p) : ids[p]), ex = id - first;
        if (SLICES && id >= sl_from) {
            // slice j: w is the shared matrix's row j * glu; Q8_0's scales sit after its
            // 2 sl_up rows of quants, from that row's
            const int j = id - sl_from;
            uo = sl_up;
            wdo = (i64)(2 * sl_up - j * glu) * k + (i64)j * glu * (k >> 5) * 2;
        }
        xr = p / x_div;
        orow = p;
        nv = 1;
        w = (ex >= 0 && ex < held) ? (const unsigned char*)w_ptrs[ex] : nullptr;
    }
    // GLU (R == 2): group g is the rows g (gate) and glu + g (up) of a [2 glu, k] gate|up.
    static_assert(!GLU || R == 2, "a SwiGLU row group is one gate row and its up row");
    static_assert(!SLICES || GLU, "slices are of a gate|up");
    static_assert(!LOADS_ONLY || TY == QT_Q4_K, "the loads-only lab walks Q4_K");
    static_assert(!COMB || (MT == 1 && !GLU), "the combine rides on a one-vector product");
    // NORM: a second matrix w1 [rows1, k] after the first's ga groups, into out1 (kv_a beside
    // q_a / q_proj: the same normed x); its groups' rows are its own, clamped to its rows.
    const int ga = (rows + R - 1) / R;
    const int groups = GLU ? glu : ga + (NORM ? (rows1 + R - 1) / R : 0);
    if (w == nullptr) {
        // a pair whose expert is not held: zeros (dense, w0 = 0, the host refuses: a plain
        // product would store zeros, not add them, and a combine would be lost)
        if (ids == nullptr || early) MLA_PDL();
        for (int g = gw; g < groups; g += nw) {
            if (GLU) {
                if (lane == 0) act[(i64)orow * glu + g] = f2bf(0.f);
            } else if (lane < R && g * R + lane < rows) {
                out[(i64)orow * rows + g * R + lane] = 0.f;
            }
        }
        return;
    }
    constexpr int QV = 16 * NQ;      // Q8_0: quants a lane a step
    constexpr int LPS = 8 / NQ;      // Q4_K: lanes a super-block
    constexpr int SPS = 32 / LPS;    // Q4_K: super-blocks a warp step
    const int nsb = k >> 8, nb = k >> 5;
    const int steps = TY == QT_Q8_0 ? (k + 32 * QV - 1) / (32 * QV) : (nsb + SPS - 1) / SPS;
    // Q4_K lane roles: super-block lane / LPS of the step, sub-block pair h, and (NQ = 1)
    // which half of the pair's 32 bytes, lo.
    const int il = lane % LPS, h = NQ == 2 ? il : il >> 1, lo = NQ == 2 ? 0 : (il & 1) * 16;
    const unsigned short* wd = (const unsigned short*)(w + wdo);  // Q8_0 scales
    const i64 rb = TY == QT_Q8_0 ? (i64)k : (i64)nsb * 144;  // bytes a row (quants)
    // The load cursor: step ls of row group lg, whose rows start at lw[r] (scales at lwd[r]).
    // Counters and per-row bases instead of a division per step: the address arithmetic
    // was most of a step's instructions.
    int ls = 0, lg = gw;
    const unsigned char* lw[R];
    const unsigned short* lwd[R];
    auto rows_of = [&](int g) {
        const unsigned char* wb = w;
        const unsigned short* wdb = wd;
        int nr = rows;
        if (NORM && g >= ga) {
            wb = (const unsigned char*)w1;
            wdb = (const unsigned short*)(wb + (i64)rows1 * k);
            g -= ga;
            nr = rows1;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            // GLU: g < glu, so both rows are in the matrix (a slice's in the shared one)
            const int row = GLU ? g + r * uo : min(g * R + r, nr - 1);  // computed, not stored
            lw[r] = wb + (i64)row * rb;
            lwd[r] = wdb + (i64)row * nb;
        }
    };
    rows_of(lg);
    // Requests the load cursor's step into st (nothing past the last group) and advances.
    // BULK: a warp's DEPTH steps in flight are copies into its shared-memory slots
    // (cp.async.bulk, one lane, an mbarrier a slot) instead of registers; a slot holds the
    // step's SPS super-blocks of each of the R rows, contiguous in memory.
    static_assert(!BULK || (TY == QT_Q4_K && NQ == 2), "the bulk walk copies Q4_K steps");
    constexpr int SLOT = R * 8 * 144;  // bytes a slot (SPS = 8 super-blocks a row)
    // dynamic shared memory after x: the 8 warps' slots, then their barriers
    unsigned char* ring0 = qmv_smem + MT * (k + (k >> 5) * 8);
    unsigned char* ring = ring0 + warp * DEPTH * SLOT;
    unsigned long long* bar = (unsigned long long*)(ring0 + 8 * DEPTH * SLOT) + warp * DEPTH;
    auto issue = [&](int d) {  // the load cursor's step into slot d, and advances
        if (lg >= groups) return;
        if (lane == 0) {
            const int sb0 = ls * SPS, n = min(SPS, nsb - sb0);
            qmv_bulk_step<R>(ring + d * SLOT, lw, sb0, n, bar + d);
        }
        if (++ls == steps) {
            ls = 0;
            lg += nw;
            rows_of(lg);
        }
    };
    auto load = [&](QmvStep<TY, R, NQ>& st) {
        if (lg >= groups) return;
        qmv_load_step<TY, R, NQ>(st, lw, lwd, ls, lane, k);
        if (++ls == steps) {
            ls = 0;
            lg += nw;
            rows_of(lg);
        }
    };
    // pre[d] holds the step of group grp[d] (>= groups: none).
    QmvStep<TY, R, NQ> pre[BULK ? 1 : DEPTH];
    int grp[DEPTH];
    unsigned phase = 0;  // BULK: bit d, the parity slot d's barrier completes next
    if constexpr (BULK) {
        if (lane == 0) qmv_bar_init(bar, DEPTH);
        __syncwarp();
    }
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
        grp[d] = lg;
        if constexpr (BULK)
            issue(d);
        else
            load(pre[d]);
    }
    // dense, or early pairs: the first steps were requested before the wait
    if (ids == nullptr || early) MLA_PDL();
    if constexpr (NORM) {
        // x = bf16(RMSNorm(xf) * gamma) made here, staged (with the block sum's 32 floats)
        // after the other regions of the dynamic shared memory (qgemv.rs:
        // QmvVariant::smem_norm).
        const int off = MT * (k + (k >> 5) * 8) + (BULK ? 8 * DEPTH * (SLOT + 8) : 0);
        bf16* xn = (bf16*)(qmv_smem + ((off + 15) & ~15));
        qmv_norm_x(xf, gamma, eps, hnb, xr, nv, k, xq, xd, xs, xn);
    } else
    for (int v = 0; v < nv; v++) {
        const bf16* xrow = x + (i64)(xr + v) * k;
        if constexpr (QCOOP) {
            q8_coop(xrow, nb, xq + v * k, xd + v * nb, xs + v * nb);
        } else {
            for (int b = threadIdx.x; b < nb; b += blockDim.x)
                q8_block(xrow + b * 32, xq + v * k + b * 32, xd[v * nb + b], xs[v * nb + b]);
        }
    }
    __syncthreads();
    float acc[MT][R];
#pragma unroll
    for (int v = 0; v < MT; v++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[v][r] = 0.f;
    int s = 0;  // the compute cursor's step (its group: grp[d])
    for (bool more = true; more;) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            if (grp[d] >= groups) {
                more = false;
                break;
            }
            // The step computed now, copied out so the step DEPTH ahead can load into its slot
            // first (DEPTH steps in flight while one is computed).
            QmvStep<TY, R, NQ> cur;
            const int cg = grp[d];
            if constexpr (BULK) {
                // wait for slot d, read this lane's words, free the slot, refill it
                qmv_bar_wait(bar + d, (phase >> d) & 1u);
                phase ^= 1u << d;
                const unsigned char* blk = ring + d * SLOT + (lane / LPS) * 144;
                if (s * SPS + lane / LPS < nsb) {
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        cur.hd[r] = *(const uint4*)(blk + r * 8 * 144);
#pragma unroll
                        for (int j = 0; j < NQ; j++)
                            cur.q[r][j] = *(const uint4*)(blk + r * 8 * 144 + 16 + 32 * h + 16 * j);
                    }
                }
                __syncwarp();
                grp[d] = lg;
                issue(d);
            } else {
                cur = pre[d];
                grp[d] = lg;
                load(pre[d]);
            }
            if constexpr (TY == QT_Q8_0) {
                const int c = s * 32 * QV + lane * QV;
                if (c < k) {
                    float dw[R];
#pragma unroll
                    for (int r = 0; r < R; r++) dw[r] = h2f((unsigned short)cur.hd[r].x);
#pragma unroll
                    for (int v = 0; v < MT; v++) {
                        if (v < nv) {
                            uint4 xv[NQ];
#pragma unroll
                            for (int j = 0; j < NQ; j++)
                                xv[j] = *(const uint4*)(xq + v * k + c + 16 * j);
                            const float dx = xd[v * nb + (c >> 5)];
#pragma unroll
                            for (int r = 0; r < R; r++) {
                                int t = 0;
#pragma unroll
                                for (int j = 0; j < NQ; j++) t = dp4a4(cur.q[r][j], xv[j], t);
                                acc[v][r] = fmaf((float)t, dw[r] * dx, acc[v][r]);
                            }
                        }
                    }
                }
            } else {
                const int sb = s * SPS + lane / LPS;
                if (LOADS_ONLY && sb < nsb) {
                    // lab: the loads alone (every loaded word feeds one integer op)
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        unsigned t = cur.hd[r].x ^ cur.hd[r].y ^ cur.hd[r].z ^ cur.hd[r].w;
#pragma unroll
                        for (int j = 0; j < NQ; j++)
                            t ^= cur.q[r][j].x ^ cur.q[r][j].y ^ cur.q[r][j].z ^ cur.q[r][j].w;
                        acc[0][r] += (float)(t & 1u);
                    }
                } else if (sb < nsb) {
                    float d0[R], d1[R], m0[R], m1[R];
#pragma unroll
                    for (int r = 0; r < R; r++) q4k_pair(cur.hd[r], h, d0[r], d1[r], m0[r], m1[r]);
                    const int xo = sb * 256 + 64 * h, bi = xo >> 5;
#pragma unroll
                    for (int v = 0; v < MT; v++) {
                        if (v < nv) {
                            // x of sub-blocks 2h (xa) and 2h + 1 (xb) this lane's nibbles meet
                            const signed char* xv = xq + v * k + xo + lo;
                            uint4 xa[NQ], xb[NQ];
#pragma unroll
                            for (int j = 0; j < NQ; j++) {
                                xa[j] = *(const uint4*)(xv + 16 * j);
                                xb[j] = *(const uint4*)(xv + 32 + 16 * j);
                            }
                            const float* dv = xd + v * nb;
                            const float* sv = xs + v * nb;
                            const float dx0 = dv[bi];
                            const float dx1 = dv[bi + 1] * 0.0625f;  // hi nibbles: 16 q
                            // The mins cover whole sub-blocks: one lane of each pair adds
                            // them (NQ = 1).
                            const bool mins = NQ == 2 || !(il & 1);
                            const float sx0 = mins ? sv[bi] : 0.f;
                            const float sx1 = mins ? sv[bi + 1] : 0.f;
#pragma unroll
                            for (int r = 0; r < R; r++) {
                                int s0 = 0, s1 = 0;
#pragma unroll
                                for (int j = 0; j < NQ; j++) {
                                    s0 = dp4a4(nib_lo(cur.q[r][j]), xa[j], s0);
                                    s1 = dp4a4_hi16(cur.q[r][j], xb[j], s1);
                                }
                                float a = acc[v][r];
                                a = fmaf((float)s0, d0[r] * dx0, a);
                                a = fmaf((float)s1, d1[r] * dx1, a);
                                a = fmaf(-m0[r], sx0, a);
                                acc[v][r] = fmaf(-m1[r], sx1, a);
                            }
                        }
                    }
                }
            }
            if (s == steps - 1) {
                // the group's rows in its matrix, and that matrix's output (NORM: w1's, out1)
                const bool second = NORM && cg >= ga;
                const int row0 = (second ? cg - ga : cg) * R, nrow = second ? rows1 : rows;
                float* const obase = second ? out1 : out;
#pragma unroll
                for (int v = 0; v < MT; v++) {
                    // Combine: lane j < ck loads token v's slot j (weight, the group's rows)
                    // before the sums, one round trip; lane 0 then adds them in slot order
                    // through shuffles (moe_combine_pairs's sum, bit for bit), then the
                    // product. Warp-uniform branches: every lane shuffles.
                    float cwj = 0.f, cyj[R];
                    if (COMB) {
#pragma unroll
                        for (int r = 0; r < R; r++) cyj[r] = 0.f;
                        if (v < nv && lane < ck) {
                            const int tok = orow + v;
                            cwj = cw[tok * ck + lane];
#pragma unroll
                            for (int r = 0; r < R; r++)
                                cyj[r] = cy[((i64)tok * ck + lane) * rows +
                                            min(row0 + r, rows - 1)];
                        }
                    }
                    float t[R];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        t[r] = warp_sum(acc[v][r]);
                        acc[v][r] = 0.f;
                        if (COMB) {
                            if (v < nv && row0 + r < rows) {
                                float* o = out + (i64)(orow + v) * rows + row0 + r;
                                float c = 0.f;
                                for (int j = 0; j < ck; j++)
                                    c += __shfl_sync(0xffffffffu, cwj, j) *
                                         __shfl_sync(0xffffffffu, cyj[r], j);
                                if (lane == 0) {
                                    const float o1 = *o + c;
                                    *o = o1 + t[r];
                                }
                            }
                        } else if (!GLU && lane == 0 && v < nv && row0 + r < nrow) {
                            float* o = obase + (i64)(orow + v) * nrow + row0 + r;
                            *o = accumulate ? *o + t[r] : t[r];
                        }
                    }
                    // silu_mul_bf16's expression on the same two sums: bit for bit
                    if (GLU && lane == 0 && v < nv)
                        act[(i64)(orow + v) * glu + cg] =
                            f2bf(t[0] / (1.f + __expf(-t[0])) * t[R - 1]);
                }
                s = 0;
            } else {
                s++;
            }
        }
    }
}

// qmv_<type>_r<R>m<MT>[w|w3][_glu|_comb]: w = two 16-byte words of quants a lane a step
// (NQ = 2), w3 = those at three CTAs an SM; _glu, _comb = the SwiGLU and combine epilogues.
#define QMV_ENTRY_G(TYN, TY, R, MT, DEPTH, MINB, NQ, SUF, GLU)                                \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                    \
        qmv_##TYN##_r##R##m##MT##SUF(const unsigned long long* w_ptrs, unsigned long long w0,  \
                                     int first, int held, const int* ids, const bf16* x,       \
                                     int x_div, int rows, int k, int m, int accumulate,        \
                                     float* out, int glu, bf16* act, const float* cy,          \
                                     const float* cw, int ck, int sl_from, int sl_up) {        \
        MLA_WEIGHTS_FIRST(); /* qmv_t waits: dense (and early pairs) after its first loads */  \
        qmv_t<TY, R, MT, DEPTH, NQ, GLU, false, false, false, false, false, GLU && MINB == 2>(  \
            w_ptrs, w0, first, held, ids, x, x_div, rows, k, m, accumulate, out, glu, act, cy,  \
            cw, ck, sl_from, sl_up);                                                           \
    }
#define QMV_ENTRY(TYN, TY, R, MT, DEPTH, MINB, NQ, SUF) \
    QMV_ENTRY_G(TYN, TY, R, MT, DEPTH, MINB, NQ, SUF, false)
// ... and with the routed experts' combine (Combine above): qmv_<type>_r2m1<SUF>_comb.
#define QMV_ENTRY_C(TYN, TY, DEPTH, MINB, SUF)                                                 \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                    \
        qmv_##TYN##_r2m1##SUF##_comb(const unsigned long long* w_ptrs, unsigned long long w0,  \
                                     int first, int held, const int* ids, const bf16* x,       \
                                     int x_div, int rows, int k, int m, int accumulate,        \
                                     float* out, int glu, bf16* act, const float* cy,          \
                                     const float* cw, int ck, int sl_from, int sl_up) {        \
        MLA_WEIGHTS_FIRST(); /* qmv_t waits after its first loads */                           \
        qmv_t<TY, 2, 1, DEPTH, 2, false, false, true>(w_ptrs, w0, first, held, ids, x, x_div,  \
                                                      rows, k, m, accumulate, out, glu, act,   \
                                                      cy, cw, ck, sl_from, sl_up);             \
    }
// Lab kernels (examples/qgemv.rs; no engine path launches them): the Q4_K walk of the two
// M = 1 kernels with the loads alone (no product: every loaded word feeds one integer op),
// the ceiling of the walk itself (bench/cuda/qgemv.md, session 14).
#define QMV_LOADS(NAME, DEPTH, MINB)                                                           \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                    \
        NAME(const unsigned long long* w_ptrs, unsigned long long w0, int first, int held,     \
             const int* ids, const bf16* x, int x_div, int rows, int k, int m, int accumulate, \
             float* out, int glu, bf16* act, const float* cy, const float* cw, int ck,         \
             int sl_from, int sl_up) {                                                         \
        MLA_WEIGHTS_FIRST(); /* qmv_t waits */                                                 \
        qmv_t<QT_Q4_K, 2, 1, DEPTH, 2, false, true>(w_ptrs, w0, first, held, ids, x, x_div,    \
                                                    rows, k, m, accumulate, out, glu, act, cy, \
                                                    cw, ck, sl_from, sl_up);                   \
    }
// qgemv.rs's QmvVariant::ALL lists these (type, rows a warp, vectors, steps in flight: 4, 2
// or 1 where registers bind; CTAs an SM; words a lane). `w3`: three CTAs an SM (80
// registers, one step in flight), which Gpu::qmv takes at one vector where its more warps
// deal the row groups out more evenly (qgemv.rs, w3_evener). 8 rows a warp (one CTA an SM
// for the registers) measured 0-16% slower than 4 at every shape in session 6 (bench/cuda/qgemv.md).
QMV_ENTRY(q8_0, QT_Q8_0, 1, 1, 4, 2, 1, )
QMV_ENTRY(q8_0, QT_Q8_0, 2, 1, 4, 2, 1, )
QMV_ENTRY(q8_0, QT_Q8_0, 4, 1, 2, 2, 1, )
QMV_ENTRY(q8_0, QT_Q8_0, 2, 2, 4, 2, 1, )
QMV_ENTRY(q8_0, QT_Q8_0, 2, 4, 2, 2, 1, )
QMV_ENTRY(q8_0, QT_Q8_0, 2, 8, 2, 2, 1, )
QMV_ENTRY(q8_0, QT_Q8_0, 2, 1, 2, 2, 2, w)
QMV_ENTRY(q8_0, QT_Q8_0, 4, 1, 1, 2, 2, w)
QMV_ENTRY(q8_0, QT_Q8_0, 2, 2, 2, 2, 2, w)
QMV_ENTRY(q8_0, QT_Q8_0, 2, 4, 2, 2, 2, w)
QMV_ENTRY(q8_0, QT_Q8_0, 2, 8, 2, 2, 2, w)
QMV_ENTRY(q8_0, QT_Q8_0, 2, 1, 1, 3, 2, w3)
QMV_ENTRY(q4_k, QT_Q4_K, 1, 1, 4, 2, 1, )
QMV_ENTRY(q4_k, QT_Q4_K, 2, 1, 3, 2, 1, )
QMV_ENTRY(q4_k, QT_Q4_K, 4, 1, 1, 2, 1, )
QMV_ENTRY(q4_k, QT_Q4_K, 2, 2, 3, 2, 1, )
QMV_ENTRY(q4_k, QT_Q4_K, 2, 4, 2, 2, 1, )
QMV_ENTRY(q4_k, QT_Q4_K, 2, 8, 2, 2, 1, )
QMV_ENTRY(q4_k, QT_Q4_K, 2, 1, 2, 2, 2, w)
QMV_ENTRY(q4_k, QT_Q4_K, 4, 1, 1, 2, 2, w)
QMV_ENTRY(q4_k, QT_Q4_K, 2, 2, 2, 2, 2, w)
QMV_ENTRY(q4_k, QT_Q4_K, 2, 4, 2, 2, 2, w)
QMV_ENTRY(q4_k, QT_Q4_K, 2, 8, 1, 2, 2, w)
QMV_ENTRY(q4_k, QT_Q4_K, 2, 1, 1, 3, 2, w3)
// The one-vector kernels with the SwiGLU epilogue (qmv_glu, qmv_pairs_glu).
QMV_ENTRY_G(q8_0, QT_Q8_0, 2, 1, 2, 2, 2, w_glu, true)
QMV_ENTRY_G(q8_0, QT_Q8_0, 2, 1, 1, 3, 2, w3_glu, true)
QMV_ENTRY_G(q4_k, QT_Q4_K, 2, 1, 2, 2, 2, w_glu, true)
QMV_ENTRY_G(q4_k, QT_Q4_K, 2, 1, 1, 3, 2, w3_glu, true)
// ... and with the combine (qmv_combine).
QMV_ENTRY_C(q8_0, QT_Q8_0, 2, 2, w)
QMV_ENTRY_C(q8_0, QT_Q8_0, 1, 3, w3)
QMV_ENTRY_C(q4_k, QT_Q4_K, 2, 2, w)
QMV_ENTRY_C(q4_k, QT_Q4_K, 1, 3, w3)
// ... and with the attention's RMSNorm in the prologue (NORM): qmv_<type>_r2m1<SUF>_norm, the
// one-vector kernels Gpu::qmv_norm picks as Gpu::qmv would (w, w3; Q4_K's bulk b, b3).
#define QMV_ENTRY_N(TYN, TY, DEPTH, MINB, SUF, BULK)                                           \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                    \
        qmv_##TYN##_r2m1##SUF##_norm(unsigned long long w0, int rows, int k, float* out,        \
                                     const float* xf, const float* gamma, float eps,           \
                                     bf16* hnb, unsigned long long w1, int rows1,              \
                                     float* out1) {                                            \
        MLA_WEIGHTS_FIRST(); /* qmv_t waits after its first loads */                           \
        qmv_t<TY, 2, 1, DEPTH, 2, false, false, false, BULK, false, true>(                     \
            nullptr, w0, 0, 0, nullptr, nullptr, 0, rows, k, 1, 0, out, 0, nullptr, nullptr,   \
            nullptr, 0, 0x7fffffff, 0, xf, gamma, eps, hnb, w1, rows1, out1);                  \
    }
QMV_ENTRY_N(q8_0, QT_Q8_0, 2, 2, w, false)
QMV_ENTRY_N(q8_0, QT_Q8_0, 1, 3, w3, false)
QMV_ENTRY_N(q4_k, QT_Q4_K, 2, 2, w, false)
QMV_ENTRY_N(q4_k, QT_Q4_K, 1, 3, w3, false)
QMV_ENTRY_N(q4_k, QT_Q4_K, 4, 2, b, true)
QMV_ENTRY_N(q4_k, QT_Q4_K, 3, 3, b3, true)

// Q4_K at one vector, the walk through shared memory (BULK): each warp's DEPTH steps in flight
// are cp.async.bulk copies into its slots (one lane issues them, an mbarrier a slot), x
// quantized by q8_block as there: qmv_q4_k_r2m1b[3][_glu|_comb] (Gpu::qmv picks them for
// Q4_K at K >= 4,096 on sm_90, which has the copies: QmvVariant::BULK_MIN_K). The same lanes
// add the same steps in the same order as r2m1w: the same sums, bit for bit.
#define QMV_ENTRY_B(DEPTH, MINB, SUF, GLU, COMB)                                               \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                    \
        qmv_q4_k_r2m1##SUF(const unsigned long long* w_ptrs, unsigned long long w0, int first, \
                           int held, const int* ids, const bf16* x, int x_div, int rows,       \
                           int k, int m, int accumulate, float* out, int glu, bf16* act,       \
                           const float* cy, const float* cw, int ck, int sl_from, int sl_up) { \
        MLA_WEIGHTS_FIRST(); /* qmv_t waits: dense after its first copies, pairs first */      \
        qmv_t<QT_Q4_K, 2, 1, DEPTH, 2, GLU, false, COMB, true, false>(                         \
            w_ptrs, w0, first, held, ids, x, x_div, rows, k, m, accumulate, out, glu, act, cy, \
            cw, ck, sl_from, sl_up);                                                           \
    }
QMV_ENTRY_B(4, 2, b, false, false)
QMV_ENTRY_B(4, 2, b_glu, true, false)
QMV_ENTRY_B(4, 2, b_comb, false, true)
QMV_ENTRY_B(3, 3, b3, false, false)
QMV_ENTRY_B(3, 3, b3_glu, true, false)
QMV_ENTRY_B(3, 3, b3_comb, false, true)
// Lab: the bulk walk with x quantized four lanes a block (q8_coop), and the loads alone.
#define QMV_BULK(NAME, DEPTH, MINB, LO, QC)                                                      \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                    \
        NAME(const unsigned long long* w_ptrs, unsigned long long w0, int first, int held,     \
             const int* ids, const bf16* x, int x_div, int rows, int k, int m, int accumulate, \
             float* out, int glu, bf16* act, const float* cy, const float* cw, int ck,         \
             int sl_from, int sl_up) {                                                         \
        MLA_WEIGHTS_FIRST(); /* qmv_t waits */                                                 \
        qmv_t<QT_Q4_K, 2, 1, DEPTH, 2, false, LO, false, true, QC>(                            \
            w_ptrs, w0, first, held, ids, x, x_div, rows, k, m, accumulate, out, glu, act, cy, \
            cw, ck, sl_from, sl_up);                                                           \
    }
QMV_BULK(lab_q4k_r2m1w_bulk4q, 4, 2, false, true)
QMV_BULK(lab_q4k_r2m1w3_bulk3q, 3, 3, false, true)
QMV_BULK(lab_q4k_r2m1w_bulk4_loads, 4, 2, true, false)
QMV_LOADS(lab_q4k_r2m1w_loads, 2, 2)
QMV_LOADS(lab_q4k_r2m1w3_loads, 1, 3)

// Two f32 -> bf16x2 (lo in the low half), rounded to nearest even: one cvt on sm_80+, f2bf
// before. Dequantized weights are finite, where both agree bit for bit.
__device__ __forceinline__ unsigned bf16x2_rn(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
#endif
}

// 16 Q8_0 quants (one uint4) times their scale d -> 16 bf16 (two uint4 at dst).
__device__ __forceinline__ void q8_dequant16(uint4 q, float d, uint4* dst) {
    const unsigned qq[4] = {q.x, q.y, q.z, q.w};
    unsigned o[8];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        float f[4];
        i8x4(qq[t], f);
        o[2 * t] = bf16x2_rn(f[0] * d, f[1] * d);
        o[2 * t + 1] = bf16x2_rn(f[2] * d, f[3] * d);
    }
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// 16 bytes of Q4_K nibbles from the 32 that hold sub-blocks 2h and 2h + 1 of a super-block
// (header hd) -> 16 bf16 of sub-block 2h (low nibbles, at lo) and 16 of 2h + 1 (high, at
// lo + 32 elements): w = d*sc * q - dmin*m, exactly the CPU's values, then rounded.
__device__ __forceinline__ void q4k_dequant32(uint4 hd, uint4 qs, int h, bf16* lo) {
    const float d = h2f((unsigned short)(hd.x & 0xffffu));
    const float dm = h2f((unsigned short)(hd.x >> 16));
    float sc, mn;
    q4k_scale_min(hd, 2 * h, sc, mn);
    const float d1 = d * sc, m1 = dm * mn;
    q4k_scale_min(hd, 2 * h + 1, sc, mn);
    const float d2 = d * sc, m2 = dm * mn;
    const unsigned q[4] = {qs.x, qs.y, qs.z, qs.w};
    unsigned l[8], u[8];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        float a[4], b[4];
        u4x4(q[t] & 0x0f0f0f0fu, a);
        u4x4((q[t] >> 4) & 0x0f0f0f0fu, b);
#pragma unroll
        for (int v = 0; v < 2; v++) {
            l[2 * t + v] = bf16x2_rn(fmaf(d1, a[2 * v], -m1), fmaf(d1, a[2 * v + 1], -m1));
            u[2 * t + v] = bf16x2_rn(fmaf(d2, b[2 * v], -m2), fmaf(d2, b[2 * v + 1], -m2));
        }
    }
    uint4* ol = (uint4*)lo;
    uint4* oh = (uint4*)(lo + 32);
    ol[0] = make_uint4(l[0], l[1], l[2], l[3]);
    ol[1] = make_uint4(l[4], l[5], l[6], l[7]);
    oh[0] = make_uint4(u[0], u[1], u[2], u[3]);
    oh[1] = make_uint4(u[4], u[5], u[6], u[7]);
}

// Q8_0 (repacked: quants w [rows, k], scales wd [rows, k / 32]) -> bf16 [rows, k] (round to
// nearest even of the exact value). One thread per 16 quants; grid-stride.
extern "C" __global__ void dequant_q8_0_bf16(const unsigned char* w, const unsigned short* wd,
                                             bf16* out, int rows, int k) {
    MLA_PDL();
    const i64 total = (i64)rows * k / 16;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x)
        // rows are whole blocks: the flat index finds the scale
        q8_dequant16(ldg16(w + i * 16), h2f(wd[(i * 16) >> 5]), (uint4*)(out + i * 16));
}

// Q4_K rows [rows, k] -> bf16 [rows, k]. One thread per (super-block, lane j of 8): 16 low-
// and 16 high-nibble elements, as in the GEMV; grid-stride.
extern "C" __global__ void dequant_q4_k_bf16(const unsigned char* w, bf16* out, int rows, int k) {
    MLA_PDL();
    const i64 total = (i64)rows * (k >> 8) * 8;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 sb = i >> 3;  // super-blocks are contiguous over rows
        const int j = (int)(i & 7), h = j >> 1;
        const unsigned char* blk = w + sb * 144;
        q4k_dequant32(ldg16(blk), ldg16(blk + 16 + 16 * j), h, out + sb * 256 + 64 * h + 16 * (j & 1));
    }
}
