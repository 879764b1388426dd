// One token's quantized MoE down projection in one launch (Gpu::qmv_down_comb): the routed
// pairs' down GEMVs, their weighted combine and the shared expert's down, as
// moe_gemv_combine does for bf16:
//
//   out[row] = (out[row] + sum_{j < ck} cw[j] * (W_{ids[j]}[row, :] . act[j, :f]))
//              + Ws[row, :] . act[ck .., :fs]
//
// — bit for bit qmv_pairs over the ck routed pairs (rows y) then qmv_combine of the shared
// down with y: every item's sums are the wide kernels' (NQ = 2: a lane loads the same words
// a step, walks the steps in the same order, and warp_sum adds the lanes the same way; the
// rows a warp owns change nothing in a row's sum), and the epilogue adds them as `_comb`
// does. act bf16 holds the ck routed rows of f, then the shared expert's fs (the slices'
// rows of the gate|up GEMV over pairs, back to back); each block quantizes all of it as the
// GEMVs quantize their x (q8_block per 32 values), so the same xq, xd, xs.
// Routed matrices of type TA [rows, f] through w_ptrs (index ids[j] - first < held; a pair
// not held, or without a pointer, adds zeros, as qmv_pairs' zero rows do), the shared one of
// type TB [rows, fs] at ws (Q8_0: repacked, the scales after the quants).
//
// grid (ceil(rows / QD_RG)), block 256: the block's QD_RG rows against every slot. Item it
// is slot j = it % (ck + 1) (slot ck: the shared matrix) and row pair g = it / (ck + 1);
// warp w walks items w, w + 8, ..., each item's K steps in order, with the next QD_DEPTH
// steps' weights in flight across items (the step record is the same 16-byte words for both
// types). The slots' matrices are staged in shared memory first; with flags bit 1 (the host
// vouches that ids are final: the gate|up GEMV over the same ids ran just before and its
// blocks waited for the routing, as Gpu::qmv_pairs_after) the ids are read through L2 and
// the first steps requested before the wait on the previous grid. Item sums go to shared
// memory; then a thread a row adds its slots in order.
#define QD_RG 8     // rows a block (QD_RG / 2 row pairs)
#define QD_DEPTH 2  // steps in flight a warp (the wide one-vector kernels' depth)

// An item's type, width, steps and x (its offset in act's values): what the compute side needs.
struct QdWhat {
    int ty, k, steps, xo;
};

template <int TA, int TB>
__device__ __forceinline__ QdWhat qd_what(int it, int ck, int f, int fs) {
    const int j = it % (ck + 1);
    QdWhat d;
    d.ty = j == ck ? TB : TA;
    d.k = j == ck ? fs : f;
    d.xo = j * f;
    // Q8_0: 32 quants a lane; Q4_K: 8 super-blocks a warp
    d.steps = d.ty == QT_Q8_0 ? (d.k + 1023) >> 10 : ((d.k >> 8) + 7) >> 3;
    return d;
}

// ... and, for the loads, its two rows (clamped to the last row): quants and (Q8_0) scales.
struct QdItem {
    QdWhat a;
    const unsigned char* w[2];
    const unsigned short* wd[2];
};

template <int TA, int TB>
__device__ __forceinline__ QdItem qd_item(int it, int ck, const unsigned long long* tab, int f,
                                          int fs, int rows, int r0) {
    QdItem d;
    d.a = qd_what<TA, TB>(it, ck, f, fs);
    const int k = d.a.k, g = it / (ck + 1);
    const unsigned char* base = (const unsigned char*)tab[it % (ck + 1)];
    if (base == nullptr) d.a.steps = 0;  // not held: adds zeros
    const i64 rb = d.a.ty == QT_Q8_0 ? (i64)k : (i64)(k >> 8) * 144;
    const unsigned short* wdb = (const unsigned short*)(base + (i64)rows * k);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = min(r0 + 2 * g + r, rows - 1);
        d.w[r] = base + row * rb;
        d.wd[r] = wdb + (i64)row * (k >> 5);
    }
    return d;
}

// Step s of item d into st (as qmv_t's load for NQ = 2).
__device__ __forceinline__ void qd_load(const QdItem& d, int s, int lane, QmvStep<QT_Q8_0, 2, 2>& st) {
    if (d.a.ty == QT_Q8_0) {
        const int c = s * 1024 + lane * 32;
        if (c < d.a.k) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                st.q[r][0] = ldg16(d.w[r] + c);
                st.q[r][1] = ldg16(d.w[r] + c + 16);
                st.hd[r].x = __ldg(d.wd[r] + (c >> 5));
            }
        }
    } else {
        const int sb = s * 8 + (lane >> 2), h = lane & 3;
        if (sb < (d.a.k >> 8)) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const unsigned char* blk = d.w[r] + sb * 144;
                st.hd[r] = ldg16(blk);
                st.q[r][0] = ldg16(blk + 16 + 32 * h);
                st.q[r][1] = ldg16(blk + 32 + 32 * h);
            }
        }
    }
}

// Step s of item d against the quantized x (qmv_t's sums for NQ = 2, MT = 1).
__device__ __forceinline__ void qd_step(const QdWhat& d, int s, int lane,
                                        const QmvStep<QT_Q8_0, 2, 2>& cur, const signed char* xq,
                                        const float* xd, const float* xs, float* acc) {
    if (d.ty == QT_Q8_0) {
        const int c = s * 1024 + lane * 32;
        if (c < d.k) {
            const signed char* xv = xq + d.xo + c;
            const uint4 x0 = *(const uint4*)xv, x1 = *(const uint4*)(xv + 16);
            const float dx = xd[((d.xo + c) >> 5)];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float dw = h2f((unsigned short)cur.hd[r].x);
                int t = dp4a4(cur.q[r][0], x0, 0);
                t = dp4a4(cur.q[r][1], x1, t);
                acc[r] = fmaf((float)t, dw * dx, acc[r]);
            }
        }
    } else {
        const int sb = s * 8 + (lane >> 2), h = lane & 3;
        if (sb < (d.k >> 8)) {
            const int xo = d.xo + sb * 256 + 64 * h, bi = xo >> 5;
            const uint4* xv = (const uint4*)(xq + xo);
            // the integer sums word by word (x's registers for one word at a time; integer
            // sums in any order are the same)
            int s0[2] = {0, 0}, s1[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint4 xa = xv[j], xb = xv[2 + j];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    s0[r] = dp4a4(nib_lo(cur.q[r][j]), xa, s0[r]);
                    s1[r] = dp4a4_hi16(cur.q[r][j], xb, s1[r]);
                }
            }
            const float dx0 = xd[bi], dx1 = xd[bi + 1] * 0.0625f;  // hi nibbles: 16 q
            const float sx0 = xs[bi], sx1 = xs[bi + 1];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float d0, d1, m0, m1;
                q4k_pair(cur.hd[r], h, d0, d1, m0, m1);
                float a = acc[r];
                a = fmaf((float)s0[r], d0 * dx0, a);
                a = fmaf((float)s1[r], d1 * dx1, a);
                a = fmaf(-m0, sx0, a);
                acc[r] = fmaf(-m1, sx1, a);
            }
        }
    }
}

template <int TA, int TB>
__device__ __forceinline__ void qmv_down_comb_t(const unsigned long long* __restrict__ w_ptrs,
                                                int first, int held, const int* __restrict__ ids,
                                                int ck, const float* __restrict__ cw,
                                                const bf16* __restrict__ act, int f,
                                                unsigned long long ws, int fs, int rows,
                                                float* __restrict__ out, int flags) {
    extern __shared__ __align__(16) unsigned char qd_smem[];
    // x: xq [n] int8, xd [n / 32], xs [n / 32]; the item sums ys [ck + 1][QD_RG]; the
    // slots' matrices tab [ck + 1]
    const int n = ck * f + fs, nb = n >> 5;
    signed char* xq = (signed char*)qd_smem;
    float* xd = (float*)(qd_smem + n);
    float* xs = xd + nb;
    float* ys = xs + nb;
    // (n % 32 == 0: every region starts 8-byte aligned)
    unsigned long long* tab = (unsigned long long*)(ys + (ck + 1) * QD_RG);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = blockIdx.x * QD_RG;
    const bool early = flags & 2;
    if (!early) MLA_PDL();  // the routing's ids pick the matrices
    if ((int)threadIdx.x <= ck) {
        const int j = threadIdx.x;
        unsigned long long p = ws;
        if (j < ck) {
            const int ex = (early ? ld_cg_s32(ids + j) : ids[j]) - first;
            p = (ex >= 0 && ex < held) ? w_ptrs[ex] : 0ull;
        }
        tab[j] = p;
    }
    __syncthreads();
    const int items = (ck + 1) * (QD_RG / 2);
    // the load cursor: step ls of item li (ld: its description)
    int li = warp, ls = 0;
    QdItem ld = qd_item<TA, TB>(li, ck, tab, f, fs, rows, r0);
    // items with no steps (not held) are skipped by the loads; the compute side sees them
    auto advance = [&]() {
        if (++ls >= ld.a.steps) {
            ls = 0;
            li += 8;
            if (li < items) ld = qd_item<TA, TB>(li, ck, tab, f, fs, rows, r0);
        }
    };
    auto load = [&](QmvStep<QT_Q8_0, 2, 2>& st, int& gi, int& gs) {
        // skip items without steps (their sums are zeros, written below)
        while (li < items && ld.a.steps == 0) {
            if (lane == 0) {
                const int j = li % (ck + 1), g = li / (ck + 1);
                ys[j * QD_RG + 2 * g] = 0.f;
                ys[j * QD_RG + 2 * g + 1] = 0.f;
            }
            li += 8;
            if (li < items) ld = qd_item<TA, TB>(li, ck, tab, f, fs, rows, r0);
        }
        gi = li;
        gs = ls;
        if (li >= items) return;
        qd_load(ld, ls, lane, st);
        advance();
    };
    QmvStep<QT_Q8_0, 2, 2> pre[QD_DEPTH];
    int gi[QD_DEPTH], gs[QD_DEPTH];
#pragma unroll
    for (int d = 0; d < QD_DEPTH; d++) load(pre[d], gi[d], gs[d]);
    if (early) MLA_PDL();
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        q8_block(act + b * 32, xq + b * 32, xd[b], xs[b]);
    __syncthreads();
    float acc[2] = {0.f, 0.f};
    int ci = -1;  // the compute cursor's item
    QdWhat cd;
    for (bool more = true; more;) {
#pragma unroll
        for (int d = 0; d < QD_DEPTH; d++) {
            if (gi[d] >= items) {
                more = false;
                break;
            }
            const QmvStep<QT_Q8_0, 2, 2> cur = pre[d];
            const int it = gi[d], s = gs[d];
            load(pre[d], gi[d], gs[d]);
            if (it != ci) {
                ci = it;
                cd = qd_what<TA, TB>(it, ck, f, fs);
            }
            qd_step(cd, s, lane, cur, xq, xd, xs, acc);
            if (s == cd.steps - 1) {
                const int j = it % (ck + 1), g = it / (ck + 1);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float t = warp_sum(acc[r]);
                    acc[r] = 0.f;
                    if (lane == 0) ys[j * QD_RG + 2 * g + r] = t;
                }
            }
        }
    }
    __syncthreads();
    // a thread a row: the routed slots in order (moe_combine_pairs's sum), then the shared
    // product, as `_comb` adds them
    const int row = r0 + threadIdx.x;
    if ((int)threadIdx.x < QD_RG && row < rows) {
        float c = 0.f;
        for (int j = 0; j < ck; j++) c += cw[j] * ys[j * QD_RG + threadIdx.x];
        float* o = out + row;
        const float o1 = *o + c;
        *o = o1 + ys[ck * QD_RG + threadIdx.x];
    }
}

// qmv_down_comb_<routed type>_<shared type>
#define QMV_DOWN_COMB(TAN, TA, TBN, TB)                                                         \
    extern "C" __global__ void __launch_bounds__(256, 2) qmv_down_comb_##TAN##_##TBN(           \
        const unsigned long long* w_ptrs, int first, int held, const int* ids, int ck,          \
        const float* cw, const bf16* act, int f, unsigned long long ws, int fs, int rows,      \
        float* out, int flags) {                                                                \
        MLA_WEIGHTS_FIRST(); /* waits after the early lookups and loads (flags bit 1) */        \
        qmv_down_comb_t<TA, TB>(w_ptrs, first, held, ids, ck, cw, act, f, ws, fs, rows, out,    \
                                flags);                                                         \
    }
QMV_DOWN_COMB(q8_0, QT_Q8_0, q8_0, QT_Q8_0)
QMV_DOWN_COMB(q8_0, QT_Q8_0, q4_k, QT_Q4_K)
QMV_DOWN_COMB(q4_k, QT_Q4_K, q4_k, QT_Q4_K)
QMV_DOWN_COMB(q4_k, QT_Q4_K, q8_0, QT_Q8_0)
