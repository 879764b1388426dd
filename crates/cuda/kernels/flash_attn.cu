// Tensor-core prefill attention (the unabsorbed MLA path, dense causal key lists): the
// contract of attn_mha (attention.cu) for tokens whose key list is 0..n_keys[t], in the
// FlashAttention-2 scheme.
//
// Inputs are packed first (fa_pack_q, fa_pack_kv) into bf16, zero-padded per head to the
// variant's widths DQ >= P+R and DV >= V: qb [T, N, DQ] = [q_nope | q_pe | 0], kb [S, N, DQ] =
// [k_nope | k_pe | 0] (k_pe shared by every head), vb [S, N, DV] = [v | 0]. Zero padding adds
// nothing to a dot product, and padded output columns are never written.
//
// A block is (query tile, head): up to BM = 16·WARPS consecutive tokens of ONE sequence (the
// host builds the tiles per sequence, so they share kv_base), WARPS warps of 16 query rows.
// Key tiles of BN rows of K and V are double-buffered in shared memory by cp.async. Per key
// tile, each warp computes S = Q·K^T (m16n8k16 bf16 mma, f32 accumulators; Q kept as A
// fragments in registers when QREG), masks keys >= n_keys[row] (causal and tile tail), runs
// the online softmax in f32 with exp2 (scale·log2e folded in), rounds P to bf16 straight
// from the accumulators into A fragments and adds P·V (V B fragments by ldmatrix.trans).
// Numerics: bf16 q, k, v and P; f32 scores, softmax, sums and accumulators; out f32.
// Rows with no key (n_keys = 0) write zeros. Below sm_80 the kernels trap; the host never
// launches them there.

// Query rows per block: 16 per warp; 4 or 8 warps (a template parameter).

// One warp per (row, head): row r of a [rows, qk] f32 source -> [rows, d] bf16, zero-padded.
__device__ __forceinline__ void fa_pack_row(const float* src, int n, unsigned* dst, int d, int lane) {
    for (int c = 2 * lane; c < d; c += 64) {
        float a = c < n ? src[c] : 0.f;
        float b = c + 1 < n ? src[c + 1] : 0.f;
        dst[c / 2] = (unsigned)f2bf(a) | ((unsigned)f2bf(b) << 16);
    }
}

// q [T, N*qk] f32 -> qb [T, N, dq] bf16.  block 256 (8 rows of T*N), grid ceil(T*N / 8).
extern "C" __global__ void fa_pack_q(const float* q, bf16* qb, int rows, int qk, int dq) {
    MLA_PDL();
    i64 th = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (th >= rows) return;
    fa_pack_row(q + th * qk, qk, (unsigned*)(qb + th * dq), dq, threadIdx.x & 31);
}

// k_nope [S, N*P], k_pe [S, R], v [S, N*V] f32 -> kb [S, N, dq] = [k_nope | k_pe | 0] and
// vb [S, N, dv] bf16.  block 256 (8 rows of S*N), grid ceil(S*N / 8).
extern "C" __global__ void fa_pack_kv(const float* k_nope, const float* kpe, const float* v,
                                      bf16* kb, bf16* vb, int s_rows, int nh, int p_dim,
                                      int r_dim, int v_dim, int dq, int dv) {
    MLA_PDL();
    i64 sh = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (sh >= (i64)s_rows * nh) return;
    int lane = threadIdx.x & 31;
    const float* kn = k_nope + sh * p_dim;
    const float* kp = kpe + (sh / nh) * r_dim;
    unsigned* kd = (unsigned*)(kb + sh * dq);
    for (int c = 2 * lane; c < dq; c += 64) {
        float a = c < p_dim ? kn[c] : (c < p_dim + r_dim ? kp[c - p_dim] : 0.f);
        int c1 = c + 1;
        float b = c1 < p_dim ? kn[c1] : (c1 < p_dim + r_dim ? kp[c1 - p_dim] : 0.f);
        kd[c / 2] = (unsigned)f2bf(a) | ((unsigned)f2bf(b) << 16);
    }
    fa_pack_row(v + sh * v_dim, v_dim, (unsigned*)(vb + sh * dv), dv, lane);
}

#ifdef MLA_TC

template <int DQ, int DV, int BN, int WARPS, int MT>
struct FaShape {
    static constexpr int BM = 16 * MT * WARPS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int QROW = DQ + 8;  // shared row strides in bf16: 16 bytes past a multiple
    static constexpr int VROW = DV + 8;  // of 128, so ldmatrix rows hit distinct banks
    static constexpr int Q_ELEMS = BM * QROW;
    static constexpr int K_ELEMS = BN * QROW;
    static constexpr int V_ELEMS = BN * VROW;
    static constexpr int SMEM = 2 * (Q_ELEMS + 2 * K_ELEMS + 2 * V_ELEMS);
};

// Rows [0, rows) of a [*, D] bf16 source into shared [rows_tile][D + 8], 16-byte chunks;
// rows >= valid are zero-filled (their source address is clamped to row 0).
template <int D, int THREADS>
__device__ __forceinline__ void fa_load_rows(bf16* dst, const bf16* src, i64 row_stride,
                                             int rows_tile, int valid) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < rows_tile * CH; i += THREADS) {
        int r = i / CH, c = i % CH;
        bool ok = r < valid;
        const bf16* s = src + (ok ? (i64)r * row_stride : 0) + c * 8;
        mla_cp16(mla_smem(dst + r * (D + 8) + c * 8), s, ok ? 16 : 0);
    }
}

// MT m-tiles of 16 query rows per warp: warp w owns rows 16·MT·w .. 16·MT·w + 16·MT - 1, so
// every K/V fragment read from shared memory feeds MT mma. QREG keeps Q as A fragments in
// registers (MT = 1 only), else they are read from shared memory per k-step.
template <int DQ, int DV, int BN, int WARPS, int MT, bool QREG>
__device__ __forceinline__ void fa_fwd(const bf16* qb, const bf16* kb, const bf16* vb, float* out,
                                       const int* tiles, const int* n_keys, const int* kv_base,
                                       int nh, int v_dim, float scale_log2) {
    typedef FaShape<DQ, DV, BN, WARPS, MT> Sh;
    static_assert(!QREG || MT == 1, "Q in registers only with one m-tile per warp");
    constexpr int TH = Sh::THREADS;
    constexpr int KS = DQ / 16;  // k-steps of S
    constexpr int NT = BN / 8;   // key n-tiles of S
    constexpr int OT = DV / 8;   // output n-tiles
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16* qs = (bf16*)fa_smem;
    bf16* ks = qs + Sh::Q_ELEMS;
    bf16* vs = ks + 2 * Sh::K_ELEMS;
    __shared__ int s_kmin, s_kmax;

    const int h = blockIdx.y;
    const int t0 = tiles[2 * blockIdx.x], nt = tiles[2 * blockIdx.x + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q4 = lane & 3;
    const i64 base = kv_base[t0];

    if (threadIdx.x == 0) {
        s_kmin = 0x7fffffff;
        s_kmax = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt; i += TH) {
        int k = n_keys[t0 + i];
        atomicMin(&s_kmin, k);
        atomicMax(&s_kmax, k);
    }
    // This thread's two query rows per m-tile (g and g+8 of it) and their key counts.
    int row0[MT], nk0[MT], nk1[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        row0[m] = (warp * MT + m) * 16 + g;
        nk0[m] = row0[m] < nt ? n_keys[t0 + row0[m]] : 0;
        nk1[m] = row0[m] + 8 < nt ? n_keys[t0 + row0[m] + 8] : 0;
    }

    const i64 kstride = (i64)nh * DQ, vstride = (i64)nh * DV;
    const bf16* kh = kb + base * kstride + (i64)h * DQ;
    const bf16* vh = vb + base * vstride + (i64)h * DV;
    fa_load_rows<DQ, TH>(qs, qb + (i64)t0 * nh * DQ + (i64)h * DQ, (i64)nh * DQ, Sh::BM, nt);
    __syncthreads();
    const int kmin = s_kmin, kmax = s_kmax;
    const int ntiles = (kmax + BN - 1) / BN;
    if (ntiles > 0) {
        fa_load_rows<DQ, TH>(ks, kh, kstride, BN, min(BN, kmax));
        fa_load_rows<DV, TH>(vs, vh, vstride, BN, min(BN, kmax));
    }
    mla_commit();

    unsigned qf[QREG ? KS : 1][4];
    float o[MT][OT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < OT; i++) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.f;
    float mr0[MT], mr1[MT], l0[MT], l1[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        mr0[m] = mr1[m] = -INFINITY;
        l0[m] = l1[m] = 0.f;
    }
    // ldmatrix lane addresses: A (Q rows of m-tile 0), B of K (non-trans), B of V (trans).
    const unsigned q_addr =
        mla_smem(qs + (warp * MT * 16 + (lane & 15)) * Sh::QROW + (lane >> 4) * 8);
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
    const int v_row = lane & 15, v_col = (lane >> 4) * 8;

    for (int kt = 0; kt < ntiles; kt++) {
        const int buf = kt & 1;
        if (kt + 1 < ntiles) {
            int k0 = (kt + 1) * BN;
            fa_load_rows<DQ, TH>(ks + (buf ^ 1) * Sh::K_ELEMS, kh + k0 * kstride, kstride, BN,
                                 min(BN, kmax - k0));
            fa_load_rows<DV, TH>(vs + (buf ^ 1) * Sh::V_ELEMS, vh + k0 * vstride, vstride, BN,
                                 min(BN, kmax - k0));
            mla_commit();
            mla_wait<1>();
        } else {
            mla_wait<0>();
        }
        __syncthreads();
        if (QREG && kt == 0) {
#pragma unroll
            for (int k = 0; k < KS; k++) mla_ldsm4(qf[QREG ? k : 0], q_addr + k * 32);
        }

        // S = Q K^T for this warp's 16·MT rows x BN keys.
        float s[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int i = 0; i < NT; i++) s[m][i][0] = s[m][i][1] = s[m][i][2] = s[m][i][3] = 0.f;
        const unsigned kbase = mla_smem(ks + buf * Sh::K_ELEMS + k_row * Sh::QROW + k_col);
#pragma unroll
        for (int k = 0; k < KS; k++) {
            unsigned a[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (QREG) {
#pragma unroll
                    for (int j = 0; j < 4; j++) a[m][j] = qf[QREG ? k : 0][j];
                } else {
                    mla_ldsm4(a[m], q_addr + (m * 16 * Sh::QROW + k * 16) * 2);
                }
            }
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                unsigned b[4];
                mla_ldsm4(b, kbase + (n * 8 * Sh::QROW + k * 16) * 2);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mla_mma(s[m][n], a[m], b[0], b[1]);
                    mla_mma(s[m][n + 1], a[m], b[2], b[3]);
                }
            }
        }

        const int kbeg = kt * BN;
#pragma unroll
        for (int m = 0; m < MT; m++) {
            // Mask keys >= n_keys[row] (only tiles that reach past the shortest list).
            if (kbeg + BN > kmin) {
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    int c = kbeg + n * 8 + 2 * q4;
                    if (c >= nk0[m]) s[m][n][0] = -INFINITY;
                    if (c + 1 >= nk0[m]) s[m][n][1] = -INFINITY;
                    if (c >= nk1[m]) s[m][n][2] = -INFINITY;
                    if (c + 1 >= nk1[m]) s[m][n][3] = -INFINITY;
                }
            }
            // Online softmax over the two rows this thread holds (shared by its quad).
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                mx0 = fmaxf(mx0, fmaxf(s[m][n][0], s[m][n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[m][n][2], s[m][n][3]));
            }
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
            }
            const float nm0 = fmaxf(mr0[m], mx0 * scale_log2);
            const float nm1 = fmaxf(mr1[m], mx1 * scale_log2);
            const float u0 = nm0 == -INFINITY ? 0.f : nm0, u1 = nm1 == -INFINITY ? 0.f : nm1;
            const float a0 = mla_exp2(mr0[m] - u0), a1 = mla_exp2(mr1[m] - u1);  // exp2(-inf) = 0
            mr0[m] = nm0;
            mr1[m] = nm1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                s[m][n][0] = mla_exp2(s[m][n][0] * scale_log2 - u0);
                s[m][n][1] = mla_exp2(s[m][n][1] * scale_log2 - u0);
                s[m][n][2] = mla_exp2(s[m][n][2] * scale_log2 - u1);
                s[m][n][3] = mla_exp2(s[m][n][3] * scale_log2 - u1);
                ps0 += s[m][n][0] + s[m][n][1];
                ps1 += s[m][n][2] + s[m][n][3];
            }
            l0[m] = l0[m] * a0 + ps0;
            l1[m] = l1[m] * a1 + ps1;
#pragma unroll
            for (int i = 0; i < OT; i++) {
                o[m][i][0] *= a0;
                o[m][i][1] *= a0;
                o[m][i][2] *= a1;
                o[m][i][3] *= a1;
            }
        }

        // O += P V: P's accumulators become A fragments (16 keys per k-step).
        const unsigned vbase = mla_smem(vs + buf * Sh::V_ELEMS + v_row * Sh::VROW + v_col);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            unsigned pa[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                pa[m][0] = mla_pack(s[m][2 * kk][0], s[m][2 * kk][1]);
                pa[m][1] = mla_pack(s[m][2 * kk][2], s[m][2 * kk][3]);
                pa[m][2] = mla_pack(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
                pa[m][3] = mla_pack(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
            }
#pragma unroll
            for (int i = 0; i < OT; i += 2) {
                unsigned b[4];
                mla_ldsm4t(b, vbase + (kk * 16 * Sh::VROW + i * 8) * 2);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mla_mma(o[m][i], pa[m], b[0], b[1]);
                    mla_mma(o[m][i + 1], pa[m], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // buffer `buf` is refilled by the next iteration's prefetch
    }
    mla_wait<0>();

    const i64 ostride = (i64)nh * v_dim;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float la = l0[m], lb = l1[m];
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            la += __shfl_xor_sync(0xffffffffu, la, off);
            lb += __shfl_xor_sync(0xffffffffu, lb, off);
        }
        const float i0 = la > 0.f ? 1.f / la : 0.f, i1 = lb > 0.f ? 1.f / lb : 0.f;
        const int r0 = row0[m], r1 = r0 + 8;
        float* o0 = out + (i64)(t0 + r0) * ostride + (i64)h * v_dim;
        float* o1 = out + (i64)(t0 + r1) * ostride + (i64)h * v_dim;
#pragma unroll
        for (int i = 0; i < OT; i++) {
            int c = i * 8 + 2 * q4;
            if (r0 < nt) {
                if (c < v_dim) o0[c] = o[m][i][0] * i0;
                if (c + 1 < v_dim) o0[c + 1] = o[m][i][1] * i0;
            }
            if (r1 < nt) {
                if (c < v_dim) o1[c] = o[m][i][2] * i1;
                if (c + 1 < v_dim) o1[c + 1] = o[m][i][3] * i1;
            }
        }
    }
}

#define FA_ENTRY(NAME, DQ, DV, BN, WARPS, MT, QREG)                                             \
    extern "C" __global__ void __launch_bounds__(32 * WARPS)                                     \
        NAME(const bf16* qb, const bf16* kb, const bf16* vb, float* out, const int* tiles,      \
             const int* n_keys, const int* kv_base, int nh, int v_dim, float scale_log2) {      \
        MLA_PDL();                                                                              \
        fa_fwd<DQ, DV, BN, WARPS, MT, QREG>(qb, kb, vb, out, tiles, n_keys, kv_base, nh, v_dim, \
                                            scale_log2);                                        \
    }
#else
#define FA_ENTRY(NAME, DQ, DV, BN, WARPS, MT, QREG)                                             \
    extern "C" __global__ void NAME(const bf16* qb, const bf16* kb, const bf16* vb, float* out, \
                                    const int* tiles, const int* n_keys, const int* kv_base,    \
                                    int nh, int v_dim, float scale_log2) {                      \
        MLA_PDL();                                                                              \
        __trap();                                                                                \
    }
#endif

// Variants (name: DQ, DV, keys per tile, Q in registers). The host takes the first whose
// widths hold the model's qk and v; shared memory per block in crate::flash_attn.
FA_ENTRY(fa_fwd_d64, 64, 64, 64, 4, 1, true)
FA_ENTRY(fa_fwd_d128, 128, 128, 64, 4, 1, true)
FA_ENTRY(fa_fwd_d192v128, 192, 128, 64, 4, 1, true)
FA_ENTRY(fa_fwd_d256, 256, 256, 32, 4, 1, false)
// Lab variants: 8 warps (128 query rows) share each K/V tile; or 2 m-tiles (32 rows) per warp.
FA_ENTRY(fa_fwd_d192v128_w8, 192, 128, 64, 8, 1, true)
FA_ENTRY(fa_fwd_d256_w8, 256, 256, 64, 8, 1, false)
FA_ENTRY(fa_fwd_d256_w8n32, 256, 256, 32, 8, 1, false)
FA_ENTRY(fa_fwd_d192v128_m2, 192, 128, 64, 4, 2, false)
FA_ENTRY(fa_fwd_d192v128_m2n32, 192, 128, 32, 4, 2, false)
FA_ENTRY(fa_fwd_d128_m2, 128, 128, 64, 4, 2, false)
