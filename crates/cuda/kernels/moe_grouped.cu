// MoE for batches past the GEMV path, still without a host round trip: the (token, slot)
// pairs routed by moe_route are sorted by expert on the GPU (moe_sort), then every expert's
// rows go through one grouped tensor-core GEMM launch per projection (moe_gemm) that reads
// each expert's weights once per tile of its rows (16 or 64; 128 in moe_gemm_wg2), and
// moe_combine adds them back per token.
//
// Sorted layout: order[r] is the pair at sorted row r; rows [offsets[e], offsets[e+1]) belong
// to held expert e (local index e = id - first), ascending pair index within an expert
// (stable, so results never depend on scheduling); pos[p] is the row of pair p, -1 for a
// pair whose expert is not held on this rank. tile_off[e] counts the bm-row m-tiles before
// expert e (bm = 16 or 64, the GEMM variant's rows per m-tile); the GEMM grid is sized for
// the most tiles any routing can need and extra blocks exit at once, so launch
// configurations depend on the token count only (CUDA graphs).

#define MOE_BN 128     // output features per block: 4 warps x 32
#define MOE_BK 64      // K per stage
#define MOE_STAGES 4
#define MOE_ROW 72     // shared row stride in bf16 (144 bytes: conflict-free ldmatrix)

// One block of 1024 threads; dynamic shared memory 4 * pairs bytes, held <= 1024.
extern "C" __global__ void moe_sort(const int* ids, int pairs, int first, int held, int bm,
                                    int* order, int* pos, int* offsets, int* tile_off) {
    MLA_PDL();
    extern __shared__ int sid[];
    __shared__ int cnt[1024];
    __shared__ int off[1024];
    for (int e = threadIdx.x; e < held; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int e = ids[p] - first;
        if (e < 0 || e >= held) e = -1;
        sid[p] = e;
        if (e >= 0) atomicAdd(&cnt[e], 1);
        else pos[p] = -1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, to = 0;
        for (int e = 0; e < held; e++) {
            off[e] = o;
            offsets[e] = o;
            tile_off[e] = to;
            o += cnt[e];
            to += (cnt[e] + bm - 1) / bm;
        }
        offsets[held] = o;
        tile_off[held] = to;
    }
    __syncthreads();
    // Stable scatter: warp w takes experts w, w + 32, ...; it scans the pairs in order.
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int e = warp; e < held; e += nw) {
        if (cnt[e] == 0) continue;
        int base = off[e];
        for (int p0 = 0; p0 < pairs; p0 += 32) {
            int p = p0 + lane;
            bool m = p < pairs && sid[p] == e;
            unsigned b = __ballot_sync(0xffffffffu, m);
            if (m) {
                int r = base + __popc(b & ((1u << lane) - 1u));
                order[r] = p;
                pos[p] = r;
            }
            base += __popc(b);
        }
    }
}

#ifdef MLA_TC
__device__ __forceinline__ void moe_cp4(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}

// Raw bytes of one weight row's 64-value slice in a quantized stage (a multiple of 16: rows
// take 16-byte copies and loads): Q8_0 64 quants + the two aligned 4-byte words holding its
// two f16 scales; Q4_K the super-block header (16) + the 32 bytes of nibbles of the slice's
// two sub-blocks.
#define MOE_RAW_Q8 80  // 72 used, rounded to 16 (aligned rows)
#define MOE_RAW_Q4 48

template <int TY>
__device__ __forceinline__ constexpr int moe_raw_bytes() {
    return TY == QT_Q8_0 ? MOE_RAW_Q8 : MOE_RAW_Q4;
}

// cp.async of the raw slice (n0 + row, k0 .. k0 + 64) of a quantized matrix [n, k] into `dst`
// (shared); rows past n and Q8_0 chunks past k are zero-filled.
template <int TY>
__device__ __forceinline__ void moe_raw_load(unsigned dst, const unsigned char* w, int n, int k,
                                             int row, int k0) {
    const bool ok = row < n;
    const int r = ok ? row : 0;
    if constexpr (TY == QT_Q8_0) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const bool in = ok && k0 + 16 * c < k;
            mla_cp16(dst + 16 * c, w + (in ? (i64)r * k + k0 + 16 * c : 0), in ? 16 : 0);
        }
        // Scales of blocks k0/32, k0/32 + 1: from the 4-byte word at or below them.
        const i64 a = (i64)n * k + ((i64)r * (k >> 5) + (k0 >> 5)) * 2;
        const i64 a4 = a & ~3ll;
        moe_cp4(dst + 64, w + a4, ok ? 4 : 0);
        moe_cp4(dst + 68, w + a4 + 4, ok ? 4 : 0);
    } else {
        const unsigned char* blk = w + (ok ? (i64)r * ((k >> 8) * 144) + (i64)(k0 >> 8) * 144 : 0);
        const int h = (k0 & 255) >> 6;
        mla_cp16(dst, blk, ok ? 16 : 0);
        mla_cp16(dst + 16, blk + 16 + 32 * h, ok ? 16 : 0);
        mla_cp16(dst + 32, blk + 32 + 32 * h, ok ? 16 : 0);
    }
}

// Dequantizes a raw stage (`raw`, rows of moe_raw_bytes) into the bf16 tile `b` ([128][ROW]),
// f32 values rounded to bf16 as the host's upload does: the products then equal the bf16
// path's bit for bit. Q8_0: thread t does 16 values of rows t/4 + 32j; Q4_K: 32 values
// (16 low and 16 high nibbles) of rows t/2 + 64j. Columns past k become zeros.
template <int TY>
__device__ __forceinline__ void moe_dequant_stage(const unsigned char* raw, bf16* b, int n0,
                                                  int k, int k0) {
    const int tid = threadIdx.x;
    if constexpr (TY == QT_Q8_0) {
        const int c = tid & 3;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int rr = (tid >> 2) + 32 * j;
            const unsigned char* row = raw + rr * MOE_RAW_Q8;
            uint4* dst = (uint4*)(b + rr * MOE_ROW + 16 * c);
            if (k0 + 16 * c >= k) {
                dst[0] = dst[1] = make_uint4(0u, 0u, 0u, 0u);
                continue;
            }
            // The scale's byte offset in the two words: 2 when the row's first scale is not
            // 4-byte aligned (odd row with an odd number of blocks per row).
            const int mis = (int)((((i64)(n0 + rr) * (k >> 5)) & 1) * 2);
            const float d = h2f(*(const unsigned short*)(row + 64 + mis + 2 * (c >> 1)));
            q8_dequant16(*(const uint4*)(row + 16 * c), d, dst);
        }
    } else {
        const int h = (k0 & 255) >> 6, half = tid & 1;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int rr = (tid >> 1) + 64 * j;
            const unsigned char* row = raw + rr * MOE_RAW_Q4;
            q4k_dequant32(*(const uint4*)row, *(const uint4*)(row + 16 + 16 * half), h,
                          b + rr * MOE_ROW + 16 * half);
        }
    }
}

// Grouped expert GEMM: for every held expert e and sorted row r of e,
// out[r, :n] = W_e[:n, :k] . x[src(r), :k] with src(r) = order[r] / x_div when `gather`, else r.
// W_e [n, k] at w_ptrs[e] (0: zeros): bf16 row-major (TY 0), or quantized (TY = QT_Q8_0 /
// QT_Q4_K, qgemv.cu's layouts; k % 32 / % 256 == 0), whose raw slices go through the same
// cp.async ring and are dequantized into one bf16 tile per step; x bf16 [*, k], out f32
// [*, n]; k % 8 == 0. A block is one m-tile of BM = 16 * MT rows of one expert x 128 output
// features; warp w owns features 32w..32w+31 of all BM rows (MT mma m-tiles), so the weight
// tile in shared memory serves BM rows. grid (ceil(n / 128), max m-tiles), block 128, dynamic
// shared memory moe_gemm_smem (moe_grouped.rs: gemm_smem).
//
// Dense mode (offsets == null): one matrix at w_ptrs[0], rows 0 .. dense_m of x, m-tile
// blockIdx.y; `accumulate` adds to out (the executor's products of 2 .. 64 rows).
template <int MT, int TY>
__device__ __forceinline__ void moe_gemm_t(const unsigned long long* w_ptrs, const int* order,
                                           const bf16* x, int x_div, int gather,
                                           const int* offsets, const int* tile_off, int held,
                                           int n, int k, float* out, int dense_m,
                                           int accumulate) {
    constexpr int MOE_BM = 16 * MT;
    extern __shared__ __align__(16) unsigned char moe_smem[];
    bf16* as = (bf16*)moe_smem;                      // [STAGES][BM][ROW]
    bf16* bs = as + MOE_STAGES * MOE_BM * MOE_ROW;   // TY 0: [STAGES][128][ROW]; else [128][ROW]
    unsigned char* raw = (unsigned char*)(bs + (TY == 0 ? MOE_STAGES : 1) * MOE_BN * MOE_ROW);
    __shared__ int src[MOE_BM];
    const int j = blockIdx.y;
    int e = 0, m0, rows;
    if (offsets == nullptr) {
        m0 = j * MOE_BM;
        if (m0 >= dense_m) return;
        rows = min(MOE_BM, dense_m - m0);
    } else {
        if (j >= tile_off[held]) return;
        // The expert owning m-tile j: the last e with tile_off[e] <= j (binary search).
        int lo = 0, hi = held - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (tile_off[mid] <= j) lo = mid;
            else hi = mid - 1;
        }
        e = lo;
        m0 = offsets[e] + (j - tile_off[e]) * MOE_BM;
        rows = min(MOE_BM, offsets[e + 1] - m0);
    }
    const int n0 = blockIdx.x * MOE_BN;
    const unsigned char* wq = (const unsigned char*)w_ptrs[e];
    const bf16* w = (const bf16*)wq;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q4 = lane & 3;
    if (w == nullptr) {
        for (int i = threadIdx.x; i < rows * MOE_BN; i += 128) {
            int r = i / MOE_BN, c = n0 + i % MOE_BN;
            if (c < n && !accumulate) out[(i64)(m0 + r) * n + c] = 0.f;
        }
        return;
    }
    if (threadIdx.x < MOE_BM)
        src[threadIdx.x] =
            threadIdx.x < rows ? (gather ? order[m0 + threadIdx.x] / x_div : m0 + threadIdx.x) : 0;
    __syncthreads();
    // K steps of this block: all, or (dense mode, gridDim.z > 1) split z of gridDim.z, whose
    // partial sums go to out + z * dense_m * n for qgemm_reduce.
    int kb = 0, kt = (k + MOE_BK - 1) / MOE_BK;
    if (gridDim.z > 1) {
        const int all = kt;
        kb = (int)((i64)all * blockIdx.z / gridDim.z);
        kt = (int)((i64)all * (blockIdx.z + 1) / gridDim.z) - kb;
        out += (i64)blockIdx.z * dense_m * n;
        accumulate = 0;
    }
    constexpr int RAW = TY == 0 ? 0 : moe_raw_bytes<TY>();
    auto load = [&](int stage, int kk) {
        int k0 = (kb + kk) * MOE_BK;
        bf16* a = as + stage * MOE_BM * MOE_ROW;
        bf16* b = bs + stage * MOE_BN * MOE_ROW;
        // A: BM rows x 8 chunks; B (bf16): 128 rows x 8 chunks of 16 bytes.
        for (int i = threadIdx.x; i < (MOE_BM + (TY == 0 ? MOE_BN : 0)) * 8; i += 128) {
            int r = i >> 3, c = (i & 7) * 8;
            bool kin = k0 + c < k;
            if (r < MOE_BM) {
                bool ok = kin && r < rows;
                const bf16* s = x + (ok ? (i64)src[r] * k + k0 + c : 0);
                mla_cp16(mla_smem(a + r * MOE_ROW + c), s, ok ? 16 : 0);
            } else {
                int rr = r - MOE_BM;
                bool ok = kin && n0 + rr < n;
                const bf16* s = w + (ok ? (i64)(n0 + rr) * k + k0 + c : 0);
                mla_cp16(mla_smem(b + rr * MOE_ROW + c), s, ok ? 16 : 0);
            }
        }
        if constexpr (TY != 0)  // B (quantized): thread t's raw row slice
            moe_raw_load<TY>(mla_smem(raw + (stage * MOE_BN + threadIdx.x) * RAW), wq, n, k,
                             n0 + threadIdx.x, k0);
    };
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < kt) load(s, s);
        mla_commit();
    }
    float acc[MT][4][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[m][i][0] = acc[m][i][1] = acc[m][i][2] = acc[m][i][3] = 0.f;
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int b_row = warp * 32 + (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
    for (int kk = 0; kk < kt; kk++) {
        mla_wait<MOE_STAGES - 2>();
        __syncthreads();
        // Refill the stage consumed last iteration (every warp is past it).
        int nk = kk + MOE_STAGES - 1;
        if (nk < kt) load(nk % MOE_STAGES, nk);
        mla_commit();
        const int st = kk % MOE_STAGES;
        if constexpr (TY != 0) {
            // Every warp is past the previous step's mma (the barrier above): the tile is free.
            moe_dequant_stage<TY>(raw + st * MOE_BN * RAW, bs, n0, k, (kb + kk) * MOE_BK);
            __syncthreads();
        }
        const unsigned abase = mla_smem(as + st * MOE_BM * MOE_ROW + a_row * MOE_ROW + a_col);
        const unsigned bbase = mla_smem(bs + (TY == 0 ? st : 0) * MOE_BN * MOE_ROW +
                                        b_row * MOE_ROW + b_col);
#pragma unroll
        for (int k16 = 0; k16 < MOE_BK / 16; k16++) {
            unsigned b0[4], b1[4];
            mla_ldsm4(b0, bbase + k16 * 32);
            mla_ldsm4(b1, bbase + (16 * MOE_ROW) * 2 + k16 * 32);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                unsigned a[4];
                mla_ldsm4(a, abase + (m * 16 * MOE_ROW) * 2 + k16 * 32);
                mla_mma(acc[m][0], a, b0[0], b0[1]);
                mla_mma(acc[m][1], a, b0[2], b0[3]);
                mla_mma(acc[m][2], a, b1[0], b1[1]);
                mla_mma(acc[m][3], a, b1[2], b1[3]);
            }
        }
    }
    mla_wait<0>();
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int c = n0 + warp * 32 + i * 8 + 2 * q4, r0 = m * 16 + g, r1 = r0 + 8;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = hh ? r1 : r0;
                if (r < rows) {
                    float* o = out + (i64)(m0 + r) * n;
                    if (c < n) o[c] = accumulate ? o[c] + acc[m][i][2 * hh] : acc[m][i][2 * hh];
                    if (c + 1 < n)
                        o[c + 1] = accumulate ? o[c + 1] + acc[m][i][2 * hh + 1]
                                              : acc[m][i][2 * hh + 1];
                }
            }
        }
}

#define MOE_GEMM_ENTRY(NAME, MT, TY)                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                          \
        NAME(const unsigned long long* w_ptrs, const int* order, const bf16* x, int x_div,    \
             int gather, const int* offsets, const int* tile_off, int held, int n, int k,     \
             float* out, int dense_m, int accumulate) {                                       \
        MLA_PDL();                                                                            \
        moe_gemm_t<MT, TY>(w_ptrs, order, x, x_div, gather, offsets, tile_off, held, n, k,    \
                           out, dense_m, accumulate);                                          \
    }
MOE_GEMM_ENTRY(moe_gemm, 1, 0)
MOE_GEMM_ENTRY(moe_gemm_m4, 4, 0)
MOE_GEMM_ENTRY(moe_gemm_q8_0, 1, QT_Q8_0)
MOE_GEMM_ENTRY(moe_gemm_q8_0_m4, 4, QT_Q8_0)
MOE_GEMM_ENTRY(moe_gemm_q4_k, 1, QT_Q4_K)
MOE_GEMM_ENTRY(moe_gemm_q4_k_m4, 4, QT_Q4_K)

// The grouped GEMM of bf16 experts with 64-row tiles on sm_90a warpgroup MMA (wgmma), in
// place of moe_gemm_m4's mma.sync: the same sorted rows, tiles (tile_off for bm = 64) and
// result (f32 sums of bf16 products; the order of the adds within a 16-wide k-step is the
// tensor core's). Two warpgroups a block, 256 output features a block:
// - moe_gemm_wg2 (the executor's): two m-tiles of one expert (the blocks of its odd tiles
//   exit at once; an expert's last tile may pair with none); each warpgroup m64n256 over its
//   own x tile and the shared weights: 16 KB of x and 32 KB of weights a k-step for 4 MFLOP
//   (moe_gemm_m4: 24 KB for 1 MFLOP);
// - moe_gemm_wg2_glu: moe_gemm_wg2 over a gate|up matrix with the SwiGLU in its epilogue;
// - moe_gemm_wg: one m-tile; each warpgroup m64n128 (its half of the features) over the
//   shared x tile: 8 KB of x and 32 KB of weights for 2 MFLOP (comparisons).
// Shared memory from a 1024-byte-aligned base: stages of x and W [256][64] bf16, each one
// 128-byte-swizzled atom wide (mlw_swz), copied by cp.async two k-steps ahead at fixed trip
// counts a thread; a k-step's wgmmas are issued before the refill, and stay in flight while
// the next k-step's are issued (the refilled stage is two behind: free once the barrier shows
// both warpgroups waited for it). Grouped mode only; grid (ceil(n / 256), max m-tiles), block
// 256, dynamic shared memory moe_grouped.rs's moe_wgmma. `out` 8-byte aligned (float2 stores
// where n is even).
#define MWG_BN 256
#ifdef MLW_OK
// d[128] (+)= A·B, m64n256k16, bf16 operands from shared memory, both K-major; f32.
__device__ __forceinline__ void mwg_mma_n256(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLW_P128 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : MLW_D128(d)
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}

template <bool PAIR, bool GLU>
__device__ __forceinline__ void moe_gemm_wg_t(const unsigned long long* w_ptrs, const int* order,
                                              const bf16* x, int x_div, int gather,
                                              const int* offsets, const int* tile_off, int held,
                                              int n, int k, float* out, bf16* act) {
    static_assert(!GLU || PAIR, "the SwiGLU epilogue needs a warpgroup's 256 features");
    constexpr int STAGES = PAIR ? 4 : 5, MT = PAIR ? 2 : 1;  // m-tiles a block
    constexpr int A_BYTES = MT * 64 * 128, STAGE = A_BYTES + MWG_BN * 128;
    constexpr int NW = PAIR ? 256 : 128;  // features a warpgroup
    extern __shared__ __align__(1024) unsigned char mwg_raw[];
    __shared__ int src[64 * MT];
    const unsigned base = (mla_smem(mwg_raw) + 1023u) & ~1023u;
    const int j = blockIdx.y;
    if (j >= tile_off[held]) return;
    // The expert owning m-tile j: the last e with tile_off[e] <= j (binary search).
    int lo = 0, hi = held - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tile_off[mid] <= j) lo = mid;
        else hi = mid - 1;
    }
    const int e = lo;
    if (PAIR && ((j - tile_off[e]) & 1)) return;  // the tile before it takes it
    const int m0 = offsets[e] + (j - tile_off[e]) * 64;
    const int rows = min(64 * MT, offsets[e + 1] - m0);  // of the block's 64 * MT
    // GLU: n is f, the gate|up matrix [2f, k]; the block's features n0.. of the activation
    // take gate rows n0 .. n0 + 127 and up rows f + n0 .. f + n0 + 127.
    const int n0 = blockIdx.x * (GLU ? MWG_BN / 2 : MWG_BN);
    const bf16* w = (const bf16*)w_ptrs[e];
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, qd = lane & 3;
    if (w == nullptr) {
        constexpr int W = GLU ? MWG_BN / 2 : MWG_BN;
        for (int i = tid; i < rows * W; i += 256) {
            const int r = i / W, c = n0 + i % W;
            if (c < n) {
                if constexpr (GLU) act[(i64)(m0 + r) * n + c] = 0;  // silu(0) * 0
                else out[(i64)(m0 + r) * n + c] = 0.f;
            }
        }
        return;
    }
    if (tid < 64 * MT) src[tid] = tid < rows ? (gather ? order[m0 + tid] / x_div : m0 + tid) : 0;
    __syncthreads();
    const int kt = (k + 63) / 64;
    // k-step kk (64 values) of the x rows and the weight rows into stage `stage`; chunks
    // past k, rows past the block's rows or past n are zero-filled.
    // 256 threads: thread t copies chunk t % 8 of rows t / 8 + 32 i (fixed trip counts)
    auto load = [&](int stage, int kk) {
        const int k0 = kk * 64, c = tid & 7, r8 = tid >> 3;
        const unsigned a = base + stage * STAGE, b = a + A_BYTES;
        const bool kin = k0 + 8 * c < k;
#pragma unroll
        for (int i = 0; i < 2 * MT; i++) {
            const int r = r8 + 32 * i;
            const bool ok = kin && r < rows;
            mla_cp16(a + mlw_swz(r, c), x + (ok ? (i64)src[r] * k + k0 + 8 * c : 0), ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < MWG_BN / 32; i++) {
            const int rr = r8 + 32 * i;
            const int feat = GLU ? n0 + (rr & 127) : n0 + rr;
            const int wrow = GLU && rr >= 128 ? n + feat : feat;
            const bool ok = kin && feat < n;
            mla_cp16(b + mlw_swz(rr, c), w + (ok ? (i64)wrow * k + k0 + 8 * c : 0), ok ? 16 : 0);
        }
    };
    // This warpgroup's rows: PAIR, its own m-tile (none past the block's rows); else all 64.
    const int wrows = PAIR ? max(0, min(64, rows - 64 * wg)) : rows;
#pragma unroll
    for (int s = 0; s < STAGES - 2; s++) {
        if (s < kt) load(s, s);
        mla_commit();
    }
    float acc[NW / 2];
#pragma unroll
    for (int i = 0; i < NW / 2; i++) acc[i] = 0.f;
    for (int kk = 0; kk < kt; kk++) {
        mla_wait<STAGES - 3>();  // this thread's copies of k-step kk landed
        mlw_proxy_fence();
        __syncthreads();  // everyone's copies landed; both warpgroups waited for k-step kk - 2
        const int nk = kk + STAGES - 2;
        if (wrows > 0) {  // uniform in the warpgroup
            const unsigned a = base + (kk % STAGES) * STAGE;
            const unsigned long long da = mlw_desc(a + (PAIR ? wg * 64 * 128 : 0), 16, 1024);
            const unsigned long long db =
                mlw_desc(a + A_BYTES + (PAIR ? 0 : wg * 128 * 128), 16, 1024);
            mlw_pin<NW / 2>(acc);
            mlw_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if constexpr (PAIR) mwg_mma_n256(acc, da + 2 * ks, db + 2 * ks);
                else fw_mma_n128(acc, da + 2 * ks, db + 2 * ks, 1);
            }
            mlw_commit();
        }
        // the k-step's wgmmas issued first, then the refill (stage kk - 2: neither in flight)
        if (nk < kt) load(nk % STAGES, nk);
        mla_commit();
        if (wrows > 0) asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    mlw_wait0();
    mlw_pin<NW / 2>(acc);
    mla_wait<0>();
    // acc[4j + e]: row 16 wq + g (+ 8 for e >= 2) of this warpgroup's 64, feature 8j + 2 qd +
    // (e & 1) of its NW.
    const int r0 = 16 * wq + g, r1 = r0 + 8;
    const i64 mw = m0 + (PAIR ? 64 * wg : 0);
    if constexpr (GLU) {
        // feature c's gate sum at acc[4jj + e], its up sum 128 features on (jj + 16):
        // act = bf16(silu(gate) * up), silu_mul_bf16's arithmetic.
#pragma unroll
        for (int jj = 0; jj < 16; jj++) {
            const int c = n0 + 8 * jj + 2 * qd;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = hh ? r1 : r0;
                if (r >= wrows) continue;
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    if (c + e2 >= n) continue;
                    const float gv = acc[4 * jj + 2 * hh + e2], uv = acc[4 * (jj + 16) + 2 * hh + e2];
                    act[(mw + r) * n + c + e2] = f2bf(gv / (1.f + __expf(-gv)) * uv);
                }
            }
        }
        return;
    }
    float* o0 = out + (mw + r0) * n;
    float* o1 = out + (mw + r1) * n;
    const bool pairs = (n & 1) == 0;
    const int nw0 = n0 + (PAIR ? 0 : wg * 128);
#pragma unroll
    for (int jj = 0; jj < NW / 8; jj++) {
        const int c = nw0 + 8 * jj + 2 * qd;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            if ((hh ? r1 : r0) >= wrows) continue;
            float* o = hh ? o1 : o0;
            const float v0 = acc[4 * jj + 2 * hh], v1 = acc[4 * jj + 2 * hh + 1];
            if (pairs && c + 1 < n) {
                *reinterpret_cast<float2*>(o + c) = make_float2(v0, v1);
            } else {
                if (c < n) o[c] = v0;
                if (c + 1 < n) o[c + 1] = v1;
            }
        }
    }
}

#define MWG_ENTRY(NAME, PAIR)                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 1)                                       \
        NAME(const unsigned long long* w_ptrs, const int* order, const bf16* x, int x_div,    \
             int gather, const int* offsets, const int* tile_off, int held, int n, int k,     \
             float* out) {                                                                     \
        MLA_PDL();                                                                             \
        moe_gemm_wg_t<PAIR, false>(w_ptrs, order, x, x_div, gather, offsets, tile_off, held,  \
                                   n, k, out, nullptr);                                        \
    }
#else
#define MWG_ENTRY(NAME, PAIR)                                                                  \
    extern "C" __global__ void NAME(const unsigned long long* w_ptrs, const int* order,       \
                                    const bf16* x, int x_div, int gather, const int* offsets, \
                                    const int* tile_off, int held, int n, int k, float* out) { \
        MLA_PDL();                                                                             \
        __trap();                                                                              \
    }
#endif
MWG_ENTRY(moe_gemm_wg, false)
MWG_ENTRY(moe_gemm_wg2, true)

// moe_gemm_wg2 over a gate|up matrix [2f, k] with the SwiGLU in its epilogue: act [rows, f]
// bf16 = silu(gate) * up, no f32 [rows, 2f] and no silu_mul_bf16 launch. grid (ceil(f / 128),
// max m-tiles); a block's 256 weight rows are 128 gate and the 128 up rows f apart.
#ifdef MLW_OK
extern "C" __global__ void __launch_bounds__(256, 1)
    moe_gemm_wg2_glu(const unsigned long long* w_ptrs, const int* order, const bf16* x,
                     int x_div, int gather, const int* offsets, const int* tile_off, int held,
                     int f, int k, bf16* act) {
    MLA_PDL();
    moe_gemm_wg_t<true, true>(w_ptrs, order, x, x_div, gather, offsets, tile_off, held, f, k,
                              nullptr, act);
}
#else
extern "C" __global__ void moe_gemm_wg2_glu(const unsigned long long* w_ptrs, const int* order,
                                            const bf16* x, int x_div, int gather,
                                            const int* offsets, const int* tile_off, int held,
                                            int f, int k, bf16* act) {
    MLA_PDL();
    __trap();
}
#endif

// out[i] (+)= sum over z < splits of part[z * mn + i], z in order (deterministic).
extern "C" __global__ void qgemm_reduce(const float* part, int splits, i64 mn, int accumulate,
                                        float* out) {
    MLA_PDL();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < mn;
         i += (i64)gridDim.x * blockDim.x) {
        float v = 0.f;
        for (int z = 0; z < splits; z++) v += part[z * mn + i];
        out[i] = accumulate ? out[i] + v : v;
    }
}

#else
extern "C" __global__ void moe_gemm_wg(const unsigned long long* w_ptrs, const int* order,
                                       const bf16* x, int x_div, int gather, const int* offsets,
                                       const int* tile_off, int held, int n, int k, float* out) {
    MLA_PDL();
    __trap();
}
extern "C" __global__ void moe_gemm_wg2(const unsigned long long* w_ptrs, const int* order,
                                        const bf16* x, int x_div, int gather, const int* offsets,
                                        const int* tile_off, int held, int n, int k, float* out) {
    MLA_PDL();
    __trap();
}
extern "C" __global__ void moe_gemm_wg2_glu(const unsigned long long* w_ptrs, const int* order,
                                            const bf16* x, int x_div, int gather,
                                            const int* offsets, const int* tile_off, int held,
                                            int f, int k, bf16* act) {
    MLA_PDL();
    __trap();
}
extern "C" __global__ void qgemm_reduce(const float* part, int splits, i64 mn, int accumulate,
                                        float* out) {
    MLA_PDL();
    __trap();
}
#define MOE_GEMM_TRAP(NAME)                                                                    \
    extern "C" __global__ void NAME(const unsigned long long* w_ptrs, const int* order,        \
                                    const bf16* x, int x_div, int gather, const int* offsets,  \
                                    const int* tile_off, int held, int n, int k, float* out,   \
                                    int dense_m, int accumulate) {                             \
        MLA_PDL();                                                                             \
        __trap();                                                                              \
    }
MOE_GEMM_TRAP(moe_gemm)
MOE_GEMM_TRAP(moe_gemm_m4)
MOE_GEMM_TRAP(moe_gemm_q8_0)
MOE_GEMM_TRAP(moe_gemm_q8_0_m4)
MOE_GEMM_TRAP(moe_gemm_q4_k)
MOE_GEMM_TRAP(moe_gemm_q4_k_m4)
#endif
