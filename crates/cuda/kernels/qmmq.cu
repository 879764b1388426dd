// Products of 2 .. 64 rows of x with GGUF weights kept compressed (Q4_K, Q8_0) on int8 tensor
// cores, the scheme of llama.cpp's MMQ: weights fed to mma.sync m16n8k32 s8 as stored (Q4_K's
// nibbles masked out of their bytes, Q8_0's int8 as they are), one mma a 32-value sub-block
// giving its exact integer dot products against x quantized to int8.
//
// Q8_0: x quantized per 32 values (q8_block's rule, as the GEMV and the CPU executor quantize
// it), the scales applied per sub-block in f32:
//
//   out[t, r] = sum_s  ws[r, s] * dx[t, s] * (W_q[r, s] . x_q[t, s])
//
// with ws = d and dx the scale of x's block. The integer sum is taken out of the mma's int32
// accumulator as a float without a conversion: the accumulator starts at 0x4B400000 (the float
// 1.5 * 2^23), so it ends as the float 1.5 * 2^23 + dot exactly while |dot| < 2^22
// (32 * 128 * 127).
//
// Q4_K: x quantized with one scale a 256-value chunk and an integer factor 1 .. 8 a sub-block
// (q8u_sub), so a super-block's sum stays in integers — its 6-bit scales and mins multiply
// integer sums, and f32 work is done once a chunk (mmq_chunk_q4k). Both types: only
// f32 summation order differs from the exact product of the stored weights and the quantized x.
//
// Within a sub-block the order of k is free as long as A and B agree: lane (g, q) holds the
// mma's k positions 4q .. 4q + 3 and 16 + 4q .. 19 + 4q, here the 8 contiguous values 8q .. 8q
// + 7 of the sub-block, so a lane loads 8 bytes a row of weights and 8 bytes of each x row.
//
// x comes from q8_quantize_mmq in chunk order: for chunk c of 256 values, xq [c][mp][256] int8
// and xds [c][8][mp] float2 (Q8_0: (dx, dx * sum(x_q)) a sub-block; Q4_K: q8u_sub's slots),
// mp = 8 * NT rows, rows past m zero. A block is 4 warps
// x 16 weight rows; it walks its chunks (all, or split `split` of `splits` along K — dense
// launches split by blockIdx.y — whose partial sums go to out + split * m * rows for
// qgemm_reduce) with the weights of the next chunk in registers and x through a 3-stage
// cp.async ring in shared memory. Grouped launches (qmmq_grouped_*) run the same body per
// m-tile of an expert's sorted rows.
// The m-tile j's expert and rows of a grouped launch (moe_grouped.cu's layout: tile_off[e]
// tiles of bm rows before expert e, its sorted rows offsets[e] .. offsets[e + 1]); false past
// the last tile.
__device__ __forceinline__ bool mmq_tile(const int* offsets, const int* tile_off, int held,
                                         int bm, int j, int& e, int& m0, int& n) {
    if (j >= tile_off[held]) return false;
    int lo = 0, hi = held - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tile_off[mid] <= j) lo = mid;
        else hi = mid - 1;
    }
    e = lo;
    m0 = offsets[e] + (j - tile_off[e]) * bm;
    n = min(bm, offsets[e + 1] - m0);
    return true;
}

#ifdef MLA_TC

#define MMQ_XS 288      // shared row stride of a row of x's 256 quants: conflict-free 8-byte loads
#define MMQ_STAGES 3
#define MMQ_THREADS 128  // a block: 4 warps x 16 weight rows (every launch, qmmq.rs)
// Register bounds: the 2-tile kernels 4 blocks an SM (Q8_0 grouped took 147 unbounded), the
// 4-tile ones 3 (Q4_K took 173: 2 blocks); no spills (ptxas -v).
#define MMQ_BOUNDS_1 __launch_bounds__(MMQ_THREADS)
#define MMQ_BOUNDS_2 __launch_bounds__(MMQ_THREADS, 4)
#define MMQ_BOUNDS_4 __launch_bounds__(MMQ_THREADS, 3)
#define MMQ_BOUNDS_8 __launch_bounds__(MMQ_THREADS)

// c = A . B + c0 (c0 in every lane of the accumulator): 0x4B400000 for Q8_0's float read,
// 0 for Q4_K's integer sums.
__device__ __forceinline__ void mmq_mma(unsigned* c, const unsigned* a, unsigned b0, unsigned b1,
                                        unsigned c0) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0));
}

// A chunk (256 values) of the lane's two rows ra = g, rb = g + 8 of its warp.
template <int TY>
struct MmqW;
template <>
struct MmqW<QT_Q4_K> {
    uint4 ha, hb;     // super-block headers (d, dmin, scales)
    uint2 qa[4], qb[4];  // bytes 32h + 8q .. + 7 of the 128 quant bytes, h < 4
};
template <>
struct MmqW<QT_Q8_0> {
    uint4 sa, sb;     // the 8 f16 scales of the chunk
    uint2 qa[8], qb[8];  // bytes 32s + 8q .. + 7 of the chunk's 256 quants, s < 8
};

// Row bases: Q4_K rows of k / 256 super-blocks of 144 bytes; Q8_0 int8 [rows, k] then f16
// scales [rows, k / 32].
template <int TY>
__device__ __forceinline__ void mmq_load(MmqW<TY>& r, const unsigned char* w, int rows, int k,
                                         int ra, int rb, int c, int q) {
    if constexpr (TY == QT_Q4_K) {
        const i64 rowb = (i64)(k >> 8) * 144;
        const unsigned char* pa = w + ra * rowb + c * 144;
        const unsigned char* pb = w + rb * rowb + c * 144;
        r.ha = ldg16(pa);
        r.hb = ldg16(pb);
#pragma unroll
        for (int h = 0; h < 4; h++) {
            r.qa[h] = __ldg((const uint2*)(pa + 16 + 32 * h + 8 * q));
            r.qb[h] = __ldg((const uint2*)(pb + 16 + 32 * h + 8 * q));
        }
    } else {
        const unsigned char* pa = w + (i64)ra * k + c * 256;
        const unsigned char* pb = w + (i64)rb * k + c * 256;
        const unsigned char* sc = w + (i64)rows * k;
        r.sa = ldg16(sc + ((i64)ra * (k >> 5) + c * 8) * 2);
        r.sb = ldg16(sc + ((i64)rb * (k >> 5) + c * 8) * 2);
#pragma unroll
        for (int s = 0; s < 8; s++) {
            r.qa[s] = __ldg((const uint2*)(pa + 32 * s + 8 * q));
            r.qb[s] = __ldg((const uint2*)(pb + 32 * s + 8 * q));
        }
    }
}

// One Q8_0 sub-block s of the chunk against the NT tiles of 8 rows of x in stage `st`.
template <int NT>
__device__ __forceinline__ void mmq_sub(float (&acc)[NT][4], const unsigned (&a)[4], float wsa,
                                        float wsb, const unsigned char* st, int s, int g, int q) {
    constexpr int MP = 8 * NT;
    const float2* ds = (const float2*)(st + MP * MMQ_XS) + s * MP;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint2 b = *(const uint2*)(st + (8 * t + g) * MMQ_XS + 32 * s + 8 * q);
        const float4 d = *(const float4*)&ds[8 * t + 2 * q];  // dx of rows 2q, 2q + 1: .x, .z
        unsigned c[4];
        mmq_mma(c, a, b.x, b.y, 0x4B400000u);
        const float f0 = __uint_as_float(c[0]) - 12582912.f, f1 = __uint_as_float(c[1]) - 12582912.f;
        const float f2 = __uint_as_float(c[2]) - 12582912.f, f3 = __uint_as_float(c[3]) - 12582912.f;
        acc[t][0] = fmaf(wsa, d.x * f0, acc[t][0]);
        acc[t][1] = fmaf(wsa, d.z * f1, acc[t][1]);
        acc[t][2] = fmaf(wsb, d.x * f2, acc[t][2]);
        acc[t][3] = fmaf(wsb, d.z * f3, acc[t][3]);
    }
}

// Q4_K's 6-bit scales (bytes 0, 1 of `sc`) and mins (of `mn`) of sub-blocks 2h and 2h + 1 from
// a super-block header, as integers (q4k_pair's bytes, before its f32 products).
__device__ __forceinline__ void q4k_pair_i(uint4 hd, int h, unsigned& sc, unsigned& mn) {
    const int sh = 16 * (h & 1);
    const unsigned y = (hd.y >> sh) & 0xffffu, z = (hd.z >> sh) & 0xffffu,
                   w = (hd.w >> sh) & 0xffffu;
    sc = h < 2 ? (y & 0x3f3fu) : ((w & 0x0f0fu) | ((y >> 2) & 0x3030u));
    mn = h < 2 ? (z & 0x3f3fu) : (((w >> 4) & 0x0f0fu) | ((z >> 2) & 0x3030u));
}

// Q4_K against x quantized with a scale a chunk and an integer factor a sub-block
// (q8u_sub: x[t, k] = D[t] * u[t, s] * x_q[t, k], u in 1 .. 8), so the whole super-block's sum
// stays in integers:
//
//   out[t, r] += D[t] * (d[r] * sum_s sc[r, s] u[t, s] (W_q[r, s] . x_q[t, s])
//                        - dmin[r] * sum_s m[r, s] u[t, s] bsum[t, s])
//
// bsum = sum(x_q) over a sub-block. xds' slots of x row t: sub-block 2h (u[2h], the int16 pair
// (u bsum) of 2h and 2h + 1), 2h + 1 (u[2h + 1], D). Per sub-block and output an IMUL (u) and an
// IMAD (sc), half a dp2a for the min (both sub-blocks of a pair at once); the f32 work once a
// chunk. |sums| < 2^31: 8 * 63 * 8 * 32 * 15 * 127 and 8 * 63 * 8 * 32 * 127.
template <int NT>
__device__ __forceinline__ void mmq_chunk_q4k(float (&acc)[NT][4], const MmqW<QT_Q4_K>& r,
                                              const unsigned char* st, int g, int q) {
    constexpr int MP = 8 * NT;
    const float2* ds = (const float2*)(st + MP * MMQ_XS);
    const float da = h2f((unsigned short)(r.ha.x & 0xffffu)), ma = h2f((unsigned short)(r.ha.x >> 16));
    const float db = h2f((unsigned short)(r.hb.x & 0xffffu)), mb = h2f((unsigned short)(r.hb.x >> 16));
    int si[NT][4], mi[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) si[t][e] = mi[t][e] = 0;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        unsigned sca, mna, scb, mnb;
        q4k_pair_i(r.ha, h, sca, mna);
        q4k_pair_i(r.hb, h, scb, mnb);
        const unsigned lo[4] = {r.qa[h].x & 0x0f0f0f0fu, r.qb[h].x & 0x0f0f0f0fu,
                                r.qa[h].y & 0x0f0f0f0fu, r.qb[h].y & 0x0f0f0f0fu};
        const unsigned hi[4] = {(r.qa[h].x >> 4) & 0x0f0f0f0fu, (r.qb[h].x >> 4) & 0x0f0f0f0fu,
                                (r.qa[h].y >> 4) & 0x0f0f0f0fu, (r.qb[h].y >> 4) & 0x0f0f0f0fu};
        const int sa0 = sca & 0xff, sa1 = sca >> 8, sb0 = scb & 0xff, sb1 = scb >> 8;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const unsigned char* xr = st + (8 * t + g) * MMQ_XS + 64 * h + 8 * q;
            const uint2 bl = *(const uint2*)xr, bh = *(const uint2*)(xr + 32);
            // x rows 2q, 2q + 1: (u[2h], pair) and (u[2h + 1], D)
            const int4 pe = *(const int4*)&ds[2 * h * MP + 8 * t + 2 * q];
            const int4 po = *(const int4*)&ds[(2 * h + 1) * MP + 8 * t + 2 * q];
            unsigned c[4];
            mmq_mma(c, lo, bl.x, bl.y, 0u);
            si[t][0] += sa0 * ((int)c[0] * pe.x);
            si[t][1] += sa0 * ((int)c[1] * pe.z);
            si[t][2] += sb0 * ((int)c[2] * pe.x);
            si[t][3] += sb0 * ((int)c[3] * pe.z);
            mmq_mma(c, hi, bh.x, bh.y, 0u);
            si[t][0] += sa1 * ((int)c[0] * po.x);
            si[t][1] += sa1 * ((int)c[1] * po.z);
            si[t][2] += sb1 * ((int)c[2] * po.x);
            si[t][3] += sb1 * ((int)c[3] * po.z);
            mi[t][0] = __dp2a_lo(pe.y, (int)mna, mi[t][0]);
            mi[t][1] = __dp2a_lo(pe.w, (int)mna, mi[t][1]);
            mi[t][2] = __dp2a_lo(pe.y, (int)mnb, mi[t][2]);
            mi[t][3] = __dp2a_lo(pe.w, (int)mnb, mi[t][3]);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 po = *(const float4*)&ds[MP + 8 * t + 2 * q];  // D of rows 2q, 2q + 1
        acc[t][0] = fmaf(po.y, fmaf(da, (float)si[t][0], -ma * (float)mi[t][0]), acc[t][0]);
        acc[t][1] = fmaf(po.w, fmaf(da, (float)si[t][1], -ma * (float)mi[t][1]), acc[t][1]);
        acc[t][2] = fmaf(po.y, fmaf(db, (float)si[t][2], -mb * (float)mi[t][2]), acc[t][2]);
        acc[t][3] = fmaf(po.w, fmaf(db, (float)si[t][3], -mb * (float)mi[t][3]), acc[t][3]);
    }
}

template <int TY, int NT>
__device__ __forceinline__ void mmq_chunk(float (&acc)[NT][4], const MmqW<TY>& r,
                                          const unsigned char* st, int g, int q) {
    if constexpr (TY == QT_Q4_K) {
        mmq_chunk_q4k<NT>(acc, r, st, g, q);
    } else {
        const unsigned sa[4] = {r.sa.x, r.sa.y, r.sa.z, r.sa.w};
        const unsigned sb[4] = {r.sb.x, r.sb.y, r.sb.z, r.sb.w};
#pragma unroll
        for (int s = 0; s < 8; s++) {
            const float wa = h2f((unsigned short)(sa[s >> 1] >> (16 * (s & 1))));
            const float wb = h2f((unsigned short)(sb[s >> 1] >> (16 * (s & 1))));
            const unsigned a[4] = {r.qa[s].x, r.qb[s].x, r.qa[s].y, r.qb[s].y};
            mmq_sub<NT>(acc, a, wa, wb, st, s, g, q);
        }
    }
}

// The shared memory of a launch: MMQ_STAGES stages of x (quants, then the 8 sub-blocks' xds
// slots: Q8_0 (dx, dx * sum(x_q)), of which the kernel reads dx; Q4_K q8u_sub's).
template <int NT>
__device__ __forceinline__ constexpr int mmq_stage_bytes() {
    return 8 * NT * MMQ_XS + 8 * 8 * NT * 8;
}

// Dense: W's first chunk is requested before the wait on the previous grid (weights are
// never written by a kernel); grouped launches (`waited`) have waited already (the routing's
// sort names their matrix).
template <int TY, int NT>
__device__ __forceinline__ void qmmq_body(const unsigned char* w, int rows, int k,
                                          const signed char* xq, const float2* xds, int m,
                                          float* out, int accumulate, bool waited, int split,
                                          int splits) {
    constexpr int MP = 8 * NT, STAGE = mmq_stage_bytes<NT>();
    extern __shared__ __align__(16) unsigned char mmq_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nc = k >> 8;
    const int c0 = (int)((i64)nc * split / splits);
    const int cn = (int)((i64)nc * (split + 1) / splits) - c0;
    const int r0 = blockIdx.x * 64 + warp * 16 + g;
    const int ra = min(r0, rows - 1), rb = min(r0 + 8, rows - 1);
    MmqW<TY> cur, nxt;
    if (cn > 0) mmq_load<TY>(cur, w, rows, k, ra, rb, c0, q);
    if (!waited) MLA_PDL();  // x is the previous kernel's output
    if (splits > 1) {
        out += (i64)split * m * rows;
        accumulate = 0;
    }
    auto stage = [&](int buf, int c) {
        unsigned char* dst = mmq_smem + buf * STAGE;
        const unsigned char* src = (const unsigned char*)xq + (i64)c * MP * 256;
        // (MMQ_THREADS a block, known here: the copies unrolled, no loop a stage)
#pragma unroll
        for (int i0 = 0; i0 < MP * 16; i0 += MMQ_THREADS) {
            const int i = i0 + threadIdx.x;
            mla_cp16(mla_smem(dst + (i >> 4) * MMQ_XS + (i & 15) * 16), src + i * 16, 16);
        }
        const unsigned char* sd = (const unsigned char*)(xds + (i64)c * 8 * MP);
#pragma unroll
        for (int i0 = 0; i0 < MP * 4; i0 += MMQ_THREADS) {
            const int i = i0 + threadIdx.x;
            if (i < MP * 4) mla_cp16(mla_smem(dst + MP * MMQ_XS + i * 16), sd + i * 16, 16);
        }
    };
#pragma unroll
    for (int s = 0; s < MMQ_STAGES - 1; s++) {
        if (s < cn) stage(s, c0 + s);
        mla_commit();
    }
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    for (int i = 0; i < cn; i++) {
        if (i + 1 < cn) mmq_load<TY>(nxt, w, rows, k, ra, rb, c0 + i + 1, q);
        mla_wait<MMQ_STAGES - 2>();
        __syncthreads();  // stage i landed for all; every warp is past stage i - 1
        if (i + MMQ_STAGES - 1 < cn) stage((i + MMQ_STAGES - 1) % MMQ_STAGES, c0 + i + MMQ_STAGES - 1);
        mla_commit();
        mmq_chunk<TY, NT>(acc, cur, mmq_smem + (i % MMQ_STAGES) * STAGE, g, q);
        cur = nxt;
    }
    // acc[t]: rows r0, r0 + 8 by x rows 8t + 2q, 8t + 2q + 1.
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r0 + (e >> 1) * 8, xr = 8 * t + 2 * q + (e & 1);
            if (row < rows && xr < m) {
                float* o = out + (i64)xr * rows + row;
                *o = accumulate ? *o + acc[t][e] : acc[t][e];
            }
        }
    }
}

#define QMMQ_ENTRY(NAME, TY, NT)                                                                \
    extern "C" __global__ void MMQ_BOUNDS_##NT                                                   \
        NAME(const unsigned char* w, int rows, int k, const signed char* xq, const float2* xds, \
             int m, float* out, int accumulate) {                                               \
        MLA_WEIGHTS_FIRST();                                                                    \
        qmmq_body<TY, NT>(w, rows, k, xq, xds, m, out, accumulate, false, blockIdx.y,           \
                          gridDim.y);                                                           \
    }
QMMQ_ENTRY(qmmq_q4_k_n1, QT_Q4_K, 1)
QMMQ_ENTRY(qmmq_q4_k_n2, QT_Q4_K, 2)
QMMQ_ENTRY(qmmq_q4_k_n4, QT_Q4_K, 4)
QMMQ_ENTRY(qmmq_q4_k_n8, QT_Q4_K, 8)
QMMQ_ENTRY(qmmq_q8_0_n1, QT_Q8_0, 1)
QMMQ_ENTRY(qmmq_q8_0_n2, QT_Q8_0, 2)
QMMQ_ENTRY(qmmq_q8_0_n4, QT_Q8_0, 4)
QMMQ_ENTRY(qmmq_q8_0_n8, QT_Q8_0, 8)

// Grouped expert GEMM: out[r, :n] = W_e[:n, :k] . x_q[r] for every sorted row r of held expert
// e (moe_gemm's contract over x as quantized for the type): m-tile blockIdx.y of 8 NT rows, x
// from q8_quantize_mmq_grouped (tile j's chunks at xq + j * k * 8 NT, xds + j * (k / 32) * 8 NT).
// W_e at w_ptrs[e] (null: zeros). grid (ceil(n / 64), tiles), block 128.
#define QMMQ_GROUPED(NAME, TY, NT)                                                              \
    extern "C" __global__ void MMQ_BOUNDS_##NT                                                   \
        NAME(const unsigned long long* w_ptrs, const int* offsets, const int* tile_off,        \
             int held, int n, int k, const signed char* xq, const float2* xds, float* out) {    \
        MLA_PDL();                                                                              \
        int e, m0, rows;                                                                        \
        if (!mmq_tile(offsets, tile_off, held, 8 * NT, blockIdx.y, e, m0, rows)) return;        \
        const unsigned char* w = (const unsigned char*)w_ptrs[e];                               \
        float* o = out + (i64)m0 * n;                                                           \
        if (w == nullptr) {                                                                     \
            for (int i = threadIdx.x; i < rows * 64; i += blockDim.x) {                         \
                const int c = blockIdx.x * 64 + (i & 63);                                       \
                if (c < n) o[(i64)(i >> 6) * n + c] = 0.f;                                      \
            }                                                                                   \
            return;                                                                             \
        }                                                                                       \
        const i64 j = blockIdx.y;                                                               \
        qmmq_body<TY, NT>(w, n, k, xq + j * k * 8 * NT, xds + j * (k >> 5) * 8 * NT, rows, o,  \
                          0, true, 0, 1);                                                       \
    }
QMMQ_GROUPED(qmmq_grouped_q4_k_n2, QT_Q4_K, 2)
QMMQ_GROUPED(qmmq_grouped_q4_k_n8, QT_Q4_K, 8)
QMMQ_GROUPED(qmmq_grouped_q8_0_n2, QT_Q8_0, 2)
QMMQ_GROUPED(qmmq_grouped_q8_0_n8, QT_Q8_0, 8)

#else
#define QMMQ_TRAP(NAME)                                                                         \
    extern "C" __global__ void NAME(const unsigned char* w, int rows, int k,                    \
                                    const signed char* xq, const float2* xds, int m, float* out, \
                                    int accumulate) {                                           \
        MLA_PDL();                                                                              \
        __trap();                                                                               \
    }
QMMQ_TRAP(qmmq_q4_k_n1)
QMMQ_TRAP(qmmq_q4_k_n2)
QMMQ_TRAP(qmmq_q4_k_n4)
QMMQ_TRAP(qmmq_q4_k_n8)
QMMQ_TRAP(qmmq_q8_0_n1)
QMMQ_TRAP(qmmq_q8_0_n2)
QMMQ_TRAP(qmmq_q8_0_n4)
QMMQ_TRAP(qmmq_q8_0_n8)
#define QMMQ_GROUPED_TRAP(NAME)                                                                 \
    extern "C" __global__ void NAME(const unsigned long long* w_ptrs, const int* offsets,       \
                                    const int* tile_off, int held, int n, int k,                \
                                    const signed char* xq, const float2* xds, float* out) {     \
        MLA_PDL();                                                                              \
        __trap();                                                                               \
    }
QMMQ_GROUPED_TRAP(qmmq_grouped_q4_k_n2)
QMMQ_GROUPED_TRAP(qmmq_grouped_q4_k_n8)
QMMQ_GROUPED_TRAP(qmmq_grouped_q8_0_n2)
QMMQ_GROUPED_TRAP(qmmq_grouped_q8_0_n8)
#endif  // MLA_TC

// One 32-value sub-block s of a 256-value chunk of x quantized for qmmq's Q4_K kernels: a scale
// D a chunk and an integer factor u in 1 .. 8 a sub-block, x = D * u * q,
//   D = amax(chunk) / 1016 (127 * 8), u = min(8, ceil(amax(sub-block) / (127 * D))),
//   q = roundf(x * (1 / (D * u)))  (|q| <= 127; D == 0: u = 1, q = 0),
// so a sub-block's step is its own amax / 127 rounded up to a multiple of D (x's error stays
// near q8_block's per 32 values, where one scale a chunk would double it on outlier rows).
// The 8 sub-blocks of a chunk are lanes 8i .. 8i + 7 of one warp, which calls this as a whole
// (x null: a zero row). Returns xds' slot: even s (u, the int16 pair (u bsum) of s and s + 1),
// odd s (u, D); bsum = sum(q) over the sub-block, |u bsum| <= 8 * 32 * 127.
__device__ __forceinline__ float2 q8u_sub(const bf16* x, signed char* q, int s) {
    float v[32];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 w4 = x ? *(const uint4*)(x + 8 * i) : make_uint4(0u, 0u, 0u, 0u);
        const unsigned w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
            v[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
        }
    }
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    float cmax = amax;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
    const float D = cmax / 1016.f;
    int u = 1;
    if (D > 0.f) u = min(8, max(1, (int)ceilf(amax / (127.f * D))));
    const float step = D * (float)u;
    const float id = step > 0.f ? 1.f / step : 0.f;
    int sum = 0;
    unsigned packed[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        unsigned p = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int qi = max(-127, min(127, (int)roundf(v[4 * i + j] * id)));
            sum += qi;
            p |= ((unsigned)qi & 0xffu) << (8 * j);
        }
        packed[i] = p;
    }
    ((uint4*)q)[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    ((uint4*)q)[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    const int us = u * sum;
    const int next = __shfl_down_sync(0xffffffffu, us, 1);
    const unsigned pair = ((unsigned)us & 0xffffu) | ((unsigned)next << 16);
    return make_float2(__int_as_float(u), (s & 1) ? D : __uint_as_float(pair));
}

// x bf16 [m, k] (row stride k, k % 256 == 0) quantized into qmmq's chunk order: xq [c][mp][256]
// int8, xds [c][8][mp] float2, c < k / 256; rows m .. mp zero. q8u = 0 (Q8_0's kernels):
// per 32 values by q8_block's rule, xds (d, d * sum(q)); q8u = 1 (Q4_K's): q8u_sub's scale a
// chunk and factor a sub-block, its slots. A thread per 32 values, grid-stride; mp * k / 32 is
// a multiple of 64, so every warp is whole in every round (q8u_sub's shuffles).
extern "C" __global__ void q8_quantize_mmq(const bf16* x, int m, int mp, int k, signed char* xq,
                                           float2* xds, int q8u) {
    MLA_PDL();
    const int nb = k >> 5;
    for (i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x; b < (i64)mp * nb;
         b += (i64)gridDim.x * blockDim.x) {
        const int t = (int)(b / nb), j = (int)(b % nb), c = j >> 3, s = j & 7;
        signed char* dq = xq + ((i64)c * mp + t) * 256 + s * 32;
        float2 o = make_float2(0.f, 0.f);
        if (q8u) {
            o = q8u_sub(t < m ? x + (i64)t * k + j * 32 : nullptr, dq, s);
        } else if (t < m) {
            q8_block(x + (i64)t * k + j * 32, dq, o.x, o.y);
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) ((uint4*)dq)[i] = make_uint4(0u, 0u, 0u, 0u);
        }
        xds[((i64)c * 8 + s) * mp + t] = o;
    }
}

// The sorted rows of a grouped launch quantized as q8_quantize_mmq does (q8u the same), tile
// by tile: tile j (bm rows, moe_grouped.cu's layout) at xq + j * k * bm, xds + j * (k / 32) *
// bm, in chunk order; row t of tile j is sorted row r = m0 + t, x row order[r] / x_div when
// `gather`, else r; rows past the tile's end zero. Tiles past the last are left alone (the
// GEMM skips them; bm * k / 32 is a multiple of 64, so a warp never straddles two tiles).
extern "C" __global__ void q8_quantize_mmq_grouped(const bf16* x, const int* order, int x_div,
                                                   int gather, const int* offsets,
                                                   const int* tile_off, int held, int bm,
                                                   int tiles, int k, signed char* xq,
                                                   float2* xds, int q8u) {
    MLA_PDL();
    const int nb = k >> 5;
    for (i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x; b < (i64)tiles * bm * nb;
         b += (i64)gridDim.x * blockDim.x) {
        const int j = (int)(b / ((i64)bm * nb)), t = (int)(b / nb % bm), jb = (int)(b % nb);
        int e, m0, rows;
        if (!mmq_tile(offsets, tile_off, held, bm, j, e, m0, rows)) continue;
        const int c = jb >> 3, s = jb & 7;
        signed char* dq = xq + (i64)j * k * bm + ((i64)c * bm + t) * 256 + s * 32;
        const bf16* src = nullptr;
        if (t < rows) {
            const int r = m0 + t;
            src = x + (i64)(gather ? order[r] / x_div : r) * k + jb * 32;
        }
        float2 o = make_float2(0.f, 0.f);
        if (q8u) {
            o = q8u_sub(src, dq, s);
        } else if (src) {
            q8_block(src, dq, o.x, o.y);
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++) ((uint4*)dq)[i] = make_uint4(0u, 0u, 0u, 0u);
        }
        xds[(i64)j * nb * bm + ((i64)c * 8 + s) * bm + t] = o;
    }
}
