// Tensor-core prefill attention on sm_90a warpgroup MMA (wgmma): the contract of
// flash_attn.cu's kernels (packed bf16 qb [T, N, DQ], kb [S, N, DQ], vb [S, N, DV]; query
// tiles of one sequence; token t attends keys 0..n_keys[t] at rows kv_base[t] + p; out f32
// [T, N, v_dim]). The executor's prefill kernels on sm_90a (FaVariant::choose): 294-372
// TFLOP/s at 4k-8k tokens on the H200, 1.3-1.6x the mma.sync kernels, 1.2x FlashAttention-2
// at qk = v = 256 (bench/cuda/flash_attn.md).
//
// A block is (query tile of up to 128 tokens, head): two warpgroups of 64 query rows each
// (warp w of a warpgroup owns 16 rows), sharing K/V tiles of BN keys. Shared memory from a
// 1024-byte-aligned base, every matrix in the 128-byte-swizzled layout of the decode kernel
// (mla_decode_wgmma.cu): Q [128][DQ] (DQ/64 atoms of 128 rows), K 2 x [BN][DQ], V 2 x [BN][DV]
// (atoms of BN rows), copied by cp.async. Per key tile each warpgroup computes
// S = Q·K^T (wgmma m64nBNk16, A = its 64 Q rows, B = K rows K-major), masks keys >= n_keys
// of the row, takes the online softmax (exp2, scale folded into the FFMA; a row's BN keys sit
// in one quad, so no exchange between warps), keeps P in registers as the A fragments of
// O += P·V (wgmma m64nDVk16 with A from registers: the accumulator layout of S is the A
// fragment layout, as for mma.sync) with V N-major (LBO = one atom of BN rows, SBO = 8 rows).
// Numerics as flash_attn.cu: bf16 q, k, v and P; f32 scores, softmax, sums, accumulators.

#ifdef MLW_OK

// d[64] (+)= A·B, m64n128k16, bf16 operands from shared memory (descriptors), f32
// accumulators; B K-major. acc = 0 overwrites d.
__device__ __forceinline__ void fw_mma_n128(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MLW_P64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : MLW_D64(d)
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}

// d[64] (+)= A·B, m64n128k16: A (bf16, 4 registers a thread: the m16n8k16 A fragment of
// this warp's 16 rows) from registers, B from shared memory, N-major (transposed); f32.
__device__ __forceinline__ void fw_mma_rs_n128t(float* d, const unsigned* a, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MLW_P64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : MLW_D64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
        : "memory");
}

// d[128] (+)= A·B, m64n256k16: A (bf16, 4 registers a thread: the m16n8k16 A fragment of
// this warp's 16 rows) from registers, B from shared memory, N-major (transposed); f32.
__device__ __forceinline__ void fw_mma_rs_n256t(float* d, const unsigned* a, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLW_P128 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : MLW_D128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
        : "memory");
}

// Rows [0, rows) of a [*, D] bf16 source (row stride `stride`) into a swizzled [rows][D] tile
// of D/64 atoms `atom` bytes apart; rows >= valid are zero-filled.
template <int D, int ROWS>
__device__ __forceinline__ void fw_load(unsigned dst, const bf16* src, i64 stride, int valid) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < ROWS * CH; i += MLA_THREADS) {
        const int r = i / CH, c = i - r * CH;
        const bool ok = r < valid;
        mla_cp16(dst + (c >> 3) * (ROWS * 128) + mlw_swz(r, c & 7), src + (ok ? (i64)r * stride : 0) + 8 * c,
                 ok ? 16 : 0);
    }
}

template <int N>
__device__ __forceinline__ void fw_mma_s(float* s, unsigned long long da, unsigned long long db, int acc) {
    if constexpr (N == 128) fw_mma_n128(s, da, db, acc);
    else mlw_mma_n64(s, da, db, acc);
}

template <int N>
__device__ __forceinline__ void fw_mma_pv(float* o, const unsigned* a, unsigned long long db) {
    if constexpr (N == 256) fw_mma_rs_n256t(o, a, db);
    else fw_mma_rs_n128t(o, a, db);
}

// Keeps P's registers (the A operand of an in-flight P·V) live until the wait that follows.
template <int KK>
__device__ __forceinline__ void fw_pin_a(unsigned (*pa)[4]) {
#pragma unroll
    for (int kk = 0; kk < KK; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(pa[kk][e])::"memory");
}

// S = Q·K^T for this warpgroup's 64 rows (q_s: its first row; k: the tile), DQ/16 k-steps of
// 16 columns, 4 per atom (32 bytes apart); issued and committed, not waited for.
template <int DQ, int BN>
__device__ __forceinline__ void fw_scores_issue(float* s, unsigned q_s, unsigned k) {
    constexpr int BM = 128;
    const unsigned long long dq = mlw_desc(q_s, 16, 1024), dk = mlw_desc(k, 16, 1024);
#pragma unroll
    for (int ks = 0; ks < DQ / 16; ks++) {
        const unsigned oq = ((ks >> 2) * BM * 128 + (ks & 3) * 32) >> 4;
        const unsigned ok = ((ks >> 2) * BN * 128 + (ks & 3) * 32) >> 4;
        fw_mma_s<BN>(s, dq + oq, dk + ok, ks > 0);
    }
    mlw_commit();
}

// O += P·V: BN/16 k-steps of 16 keys (2 KB apart), V N-major; issued and committed.
template <int DV, int BN>
__device__ __forceinline__ void fw_pv_issue(float* o, const unsigned (*pa)[4], unsigned v) {
    const unsigned long long dv = mlw_desc(v, BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) fw_mma_pv<DV>(o, pa[kk], dv + 128 * kk);
    mlw_commit();
}

// Online softmax of one tile's scores for this thread's rows r0 (m0, l0) and r1: s[4j + e] is
// row r0 (e < 2) or r1, key kbeg + 8j + 2qd + (e & 1). Keys >= the row's list length nk are
// masked, only on tiles that reach past the shortest list of the query tile (kmin). Writes P
// as the A fragments of P·V (one k-step of 16 keys each) and the factors a0, a1 that rescale O.
template <int BN>
__device__ __forceinline__ void fw_softmax(float* s, unsigned (*pa)[4], int kbeg, int kmin, int nk0,
                                           int nk1, int qd, float scale_log2, float& m0, float& m1,
                                           float& l0, float& l1, float& a0, float& a1) {
    if (kbeg + BN > kmin) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (kbeg + 8 * j + 2 * qd + (e & 1) >= (e < 2 ? nk0 : nk1)) s[4 * j + e] = -INFINITY;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float n0 = fmaxf(m0, mx0 * scale_log2), n1 = fmaxf(m1, mx1 * scale_log2);
    // A row with no key yet keeps m = -inf: exponents against 0 then give p = 0, alpha = 0.
    const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
    a0 = mla_exp2(m0 - u0);
    a1 = mla_exp2(m1 - u1);
    m0 = n0;
    m1 = n1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        float p[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int j = 2 * kk + (e >> 2);  // n8 chunks 2kk (keys +0..7) and 2kk+1
            p[e] = mla_exp2(fmaf(s[4 * j + (e & 3)], scale_log2, -((e & 3) < 2 ? u0 : u1)));
        }
        ps0 += p[0] + p[1] + p[4] + p[5];
        ps1 += p[2] + p[3] + p[6] + p[7];
        pa[kk][0] = mla_pack(p[0], p[1]);  // row g, keys 2qd, 2qd+1
        pa[kk][1] = mla_pack(p[2], p[3]);  // row g+8
        pa[kk][2] = mla_pack(p[4], p[5]);  // row g, keys 8 + 2qd..
        pa[kk][3] = mla_pack(p[6], p[7]);  // row g+8
    }
    l0 = l0 * a0 + ps0;
    l1 = l1 * a1 + ps1;
}

template <int DV>
__device__ __forceinline__ void fw_rescale(float* o, float a0, float a1) {
    if (!__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) {
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            o[4 * j] *= a0;
            o[4 * j + 1] *= a0;
            o[4 * j + 2] *= a1;
            o[4 * j + 3] *= a1;
        }
    }
}

// Per key tile: one barrier (the tile landed, the other buffer free), the next tile's copies,
// S, the softmax, P·V, each waited for. The two warpgroups overlap each other's softmax and
// MMAs. (FlashAttention-3's intra-warpgroup overlap — the scores of tile kt+1 issued with
// P·V of tile kt, their softmax while P·V runs — measured 4-13% slower here in session 6: 247
// registers against 176, bench/cuda/flash_attn.md.) S_FIRST (lab variants `_sf`) issues S
// before the next tile's copies, as the decode kernel does, so the tensor cores start at once.
template <int DQ, int DV, int BN, bool S_FIRST>
__device__ __forceinline__ void fa_wg(const bf16* qb, const bf16* kb, const bf16* vb, float* out,
                                      const int* tiles, const int* n_keys, const int* kv_base,
                                      int nh, int v_dim, float scale_log2) {
    static_assert(DQ % 64 == 0 && DV % 64 == 0 && BN % 16 == 0, "whole atoms and k-steps");
    static_assert((BN == 64 || BN == 128) && (DV == 128 || DV == 256), "the wgmma shapes below");
    constexpr int BM = 128;
    constexpr int Q_BYTES = (DQ / 64) * BM * 128, K_BYTES = (DQ / 64) * BN * 128;
    constexpr int V_BYTES = (DV / 64) * BN * 128;
    extern __shared__ __align__(1024) unsigned char fw_raw[];
    __shared__ int s_kmin, s_kmax;
    const unsigned q_s = (mla_smem(fw_raw) + 1023u) & ~1023u;
    const unsigned k_s = q_s + Q_BYTES, v_s = k_s + 2 * K_BYTES;

    const int h = blockIdx.y;
    const int t0 = tiles[2 * blockIdx.x], nt = tiles[2 * blockIdx.x + 1];
    const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, qd = lane & 3;
    const int r0 = 64 * wg + 16 * wq + g, r1 = r0 + 8;  // this thread's rows in the tile
    const i64 base = kv_base[t0];

    if (tid == 0) {
        s_kmin = 0x7fffffff;
        s_kmax = 0;
    }
    __syncthreads();
    for (int i = tid; i < nt; i += MLA_THREADS) {
        const int k = n_keys[t0 + i];
        atomicMin(&s_kmin, k);
        atomicMax(&s_kmax, k);
    }
    const int nk0 = r0 < nt ? n_keys[t0 + r0] : 0, nk1 = r1 < nt ? n_keys[t0 + r1] : 0;
    const i64 kstride = (i64)nh * DQ, vstride = (i64)nh * DV;
    const bf16* kh = kb + base * kstride + (i64)h * DQ;
    const bf16* vh = vb + base * vstride + (i64)h * DV;
    fw_load<DQ, BM>(q_s, qb + (i64)t0 * kstride + (i64)h * DQ, kstride, nt);
    __syncthreads();  // kmin, kmax
    const int kmin = s_kmin, kmax = s_kmax;
    const int ntiles = (kmax + BN - 1) / BN;
    // K or V rows of tile `tile` into buffer tile % 2, if the tile exists.
    auto load_k = [&](int tile) {
        if (tile < ntiles)
            fw_load<DQ, BN>(k_s + (tile & 1) * K_BYTES, kh + (i64)tile * BN * kstride, kstride,
                            min(BN, kmax - tile * BN));
    };
    auto load_v = [&](int tile) {
        if (tile < ntiles)
            fw_load<DV, BN>(v_s + (tile & 1) * V_BYTES, vh + (i64)tile * BN * vstride, vstride,
                            min(BN, kmax - tile * BN));
    };

    float o[DV / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f, a0, a1;
    const unsigned q_wg = q_s + wg * 64 * 128;

    load_k(0);
    load_v(0);
    mla_commit();
    for (int kt = 0; kt < ntiles; kt++) {
        const int buf = kt & 1;
        mla_wait<0>();
        mlw_proxy_fence();
        __syncthreads();  // tile kt (and Q) landed for all; P·V of tile kt-1 done everywhere
        if constexpr (!S_FIRST) {
            load_k(kt + 1);
            load_v(kt + 1);
            mla_commit();
        }
        float s[BN / 2];
        mlw_fence();
        fw_scores_issue<DQ, BN>(s, q_wg, k_s + buf * K_BYTES);
        if constexpr (S_FIRST) {
            load_k(kt + 1);
            load_v(kt + 1);
            mla_commit();
        }
        mlw_wait0();
        mlw_pin<BN / 2>(s);
        unsigned pa[BN / 16][4];
        fw_softmax<BN>(s, pa, kt * BN, kmin, nk0, nk1, qd, scale_log2, m0, m1, l0, l1, a0, a1);
        fw_rescale<DV>(o, a0, a1);
        mlw_pin<DV / 2>(o);
        mlw_fence();
        fw_pv_issue<DV, BN>(o, pa, v_s + buf * V_BYTES);
        mlw_wait0();
        mlw_pin<DV / 2>(o);
        fw_pin_a<BN / 16>(pa);
    }
    mla_wait<0>();

#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const i64 ostride = (i64)nh * v_dim;
    float* o0 = out + (i64)(t0 + r0) * ostride + (i64)h * v_dim;
    float* o1 = out + (i64)(t0 + r1) * ostride + (i64)h * v_dim;
#pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        const int c = 8 * j + 2 * qd;
        if (r0 < nt) {
            if (c < v_dim) o0[c] = o[4 * j] * i0;
            if (c + 1 < v_dim) o0[c + 1] = o[4 * j + 1] * i0;
        }
        if (r1 < nt) {
            if (c < v_dim) o1[c] = o[4 * j + 2] * i1;
            if (c + 1 < v_dim) o1[c + 1] = o[4 * j + 3] * i1;
        }
    }
}
#endif  // MLW_OK

#ifdef MLW_OK
#define FW_ENTRY(NAME, DQ, DV, BN, SF)                                                        \
    extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1)                                \
        NAME(const bf16* qb, const bf16* kb, const bf16* vb, float* out, const int* tiles,      \
             const int* n_keys, const int* kv_base, int nh, int v_dim, float scale_log2) {      \
        MLA_PDL();                                                                              \
        fa_wg<DQ, DV, BN, SF>(qb, kb, vb, out, tiles, n_keys, kv_base, nh, v_dim, scale_log2); \
    }
#else
#define FW_ENTRY(NAME, DQ, DV, BN, SF)                                                        \
    extern "C" __global__ void NAME(const bf16* qb, const bf16* kb, const bf16* vb, float* out, \
                                    const int* tiles, const int* n_keys, const int* kv_base,    \
                                    int nh, int v_dim, float scale_log2) {                      \
        MLA_PDL();                                                                              \
        __trap();                                                                                \
    }
#endif

// Variants (name: DQ, DV, keys per tile, S before the copies); shared memory per block in
// crate::flash_attn.
FW_ENTRY(fa_fwd_wg_d192v128, 192, 128, 128, false)
FW_ENTRY(fa_fwd_wg_d256, 256, 256, 64, false)
FW_ENTRY(fa_fwd_wg_d192v128_sf, 192, 128, 128, true)
FW_ENTRY(fa_fwd_wg_d256_sf, 256, 256, 64, true)
