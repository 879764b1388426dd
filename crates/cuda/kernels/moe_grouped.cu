// MoE for batches past the GEMV path, still without a host round trip: the (token, slot)
// pairs routed by moe_route are sorted by expert on the GPU (moe_sort), then every expert's
// rows go through one grouped tensor-core GEMM launch per projection (moe_gemm) that reads
// each expert's weights once per 16 rows, and moe_combine adds them back per token.
//
// Sorted layout: order[r] is the pair at sorted row r; rows [offsets[e], offsets[e+1]) belong
// to held expert e (local index e = id - first), ascending pair index within an expert
// (stable, so results never depend on scheduling); pos[p] is the row of pair p, -1 for a
// pair whose expert is not held on this rank. tile_off[e] counts the bm-row m-tiles before
// expert e (bm = 16 or 64, the GEMM variant's rows per block); the GEMM grid is sized for
// the most tiles any routing can need and extra blocks exit at once, so launch
// configurations depend on the token count only (CUDA graphs).

#define MOE_BN 128     // output features per block: 4 warps x 32
#define MOE_BK 64      // K per stage
#define MOE_STAGES 4
#define MOE_ROW 72     // shared row stride in bf16 (144 bytes: conflict-free ldmatrix)

// One block of 1024 threads; dynamic shared memory 4 * pairs bytes, held <= 1024.
extern "C" __global__ void moe_sort(const int* ids, int pairs, int first, int held, int bm,
                                    int* order, int* pos, int* offsets, int* tile_off) {
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
// Grouped expert GEMM: for every held expert e and sorted row r of e,
// out[r, :n] = W_e[:n, :k] . x[src(r), :k] with src(r) = order[r] / x_div when `gather`, else r.
// W_e bf16 [n, k] row-major at w_ptrs[e] (0: zeros), x bf16 [*, k], out f32 [*, n];
// k % 8 == 0. A block is one m-tile of BM = 16 * MT rows of one expert x 128 output
// features; warp w owns features 32w..32w+31 of all BM rows (MT mma m-tiles), so the weight
// tile in shared memory serves BM rows. grid (ceil(n / 128), max m-tiles), block 128, dynamic
// shared memory MOE_STAGES * (BM + 128) * MOE_ROW * 2 bytes.
template <int MT>
__device__ __forceinline__ void moe_gemm_t(const unsigned long long* w_ptrs, const int* order,
                                           const bf16* x, int x_div, int gather,
                                           const int* offsets, const int* tile_off, int held,
                                           int n, int k, float* out) {
    constexpr int MOE_BM = 16 * MT;
    extern __shared__ __align__(16) unsigned char moe_smem[];
    bf16* as = (bf16*)moe_smem;                                // [STAGES][16][ROW]
    bf16* bs = as + MOE_STAGES * MOE_BM * MOE_ROW;              // [STAGES][128][ROW]
    __shared__ int src[MOE_BM];
    const int j = blockIdx.y;
    if (j >= tile_off[held]) return;
    // The expert owning m-tile j: the last e with tile_off[e] <= j (binary search).
    int lo = 0, hi = held - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (tile_off[mid] <= j) lo = mid;
        else hi = mid - 1;
    }
    const int e = lo;
    const int m0 = offsets[e] + (j - tile_off[e]) * MOE_BM;
    const int rows = min(MOE_BM, offsets[e + 1] - m0);
    const int n0 = blockIdx.x * MOE_BN;
    const bf16* w = (const bf16*)w_ptrs[e];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q4 = lane & 3;
    if (w == nullptr) {
        for (int i = threadIdx.x; i < rows * MOE_BN; i += 128) {
            int r = i / MOE_BN, c = n0 + i % MOE_BN;
            if (c < n) out[(i64)(m0 + r) * n + c] = 0.f;
        }
        return;
    }
    if (threadIdx.x < MOE_BM)
        src[threadIdx.x] =
            threadIdx.x < rows ? (gather ? order[m0 + threadIdx.x] / x_div : m0 + threadIdx.x) : 0;
    __syncthreads();
    const int kt = (k + MOE_BK - 1) / MOE_BK;
    auto load = [&](int stage, int kk) {
        int k0 = kk * MOE_BK;
        bf16* a = as + stage * MOE_BM * MOE_ROW;
        bf16* b = bs + stage * MOE_BN * MOE_ROW;
        // A: 16 rows x 8 chunks; B: 128 rows x 8 chunks of 16 bytes.
        for (int i = threadIdx.x; i < (MOE_BM + MOE_BN) * 8; i += 128) {
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
        const unsigned abase = mla_smem(as + st * MOE_BM * MOE_ROW + a_row * MOE_ROW + a_col);
        const unsigned bbase = mla_smem(bs + st * MOE_BN * MOE_ROW + b_row * MOE_ROW + b_col);
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
            if (r0 < rows) {
                float* o = out + (i64)(m0 + r0) * n;
                if (c < n) o[c] = acc[m][i][0];
                if (c + 1 < n) o[c + 1] = acc[m][i][1];
            }
            if (r1 < rows) {
                float* o = out + (i64)(m0 + r1) * n;
                if (c < n) o[c] = acc[m][i][2];
                if (c + 1 < n) o[c + 1] = acc[m][i][3];
            }
        }
}

#define MOE_GEMM_ENTRY(NAME, MT)                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                          \
        NAME(const unsigned long long* w_ptrs, const int* order, const bf16* x, int x_div,    \
             int gather, const int* offsets, const int* tile_off, int held, int n, int k,     \
             float* out) {                                                                     \
        moe_gemm_t<MT>(w_ptrs, order, x, x_div, gather, offsets, tile_off, held, n, k, out); \
    }
MOE_GEMM_ENTRY(moe_gemm, 1)
MOE_GEMM_ENTRY(moe_gemm_m4, 4)

#else
extern "C" __global__ void moe_gemm(const unsigned long long* w_ptrs, const int* order,
                                    const bf16* x, int x_div, int gather, const int* offsets,
                                    const int* tile_off, int held, int n, int k, float* out) {
    __trap();
}
extern "C" __global__ void moe_gemm_m4(const unsigned long long* w_ptrs, const int* order,
                                       const bf16* x, int x_div, int gather, const int* offsets,
                                       const int* tile_off, int held, int n, int k, float* out) {
    __trap();
}
#endif
