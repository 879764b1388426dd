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
// grid (ceil(rows / RG)), block 32 NW: the block's RG rows against every slot, as items
// (slot j, row pair g). The warps split by type, so each walks one block type and a warp's
// registers are a single-type kernel's (one loop over both types spilled 40 bytes at 128
// registers, and its Q4_K step was 67 µs slower for it, session 47): warps 0 .. NW - nws
// walk the routed items, q = w, w + (NW - nws), ... of ck * RG / 2 (j = q % ck, g = q / ck),
// the last nws the shared ones (nws: the shared share of the items, at least one warp).
// Each item's K steps in order, the next QD_DEPTH steps' weights in flight across its items.
// The slots' matrices are staged in shared memory first; with flags bit 1 (the host vouches
// that ids are final: the gate|up GEMV over the same ids ran just before and its blocks
// waited for the routing, as Gpu::qmv_pairs_after) the ids are read through L2 and the
// first steps requested before the wait on the previous grid; with flags bit 2 the rest of
// each warp's rows are prefetched into L2 there too. Item sums go to shared memory; then a
// thread a row adds its slots in order.
#define QD_DEPTH 2  // steps in flight a warp (the wide one-vector kernels' depth)

// Steps of a row of width k: Q8_0 32 quants a lane; Q4_K 8 super-blocks a warp.
template <int TY>
__device__ __forceinline__ int qd_steps(int k) {
    return TY == QT_Q8_0 ? (k + 1023) >> 10 : ((k >> 8) + 7) >> 3;
}

// The 128-byte lines of bytes [p, p + n) into L2, a lane a line: line i by the address p
// (i = 0) or the line's start (every address asked for lies in [p, p + n)).
__device__ __forceinline__ void qd_prefetch_span(const unsigned char* p, i64 n, int lane) {
    const unsigned long long p0 = (unsigned long long)p, end = p0 + n;
    for (unsigned long long i = lane; (p0 & ~127ull) + 128ull * i < end; i += 32) {
        const unsigned long long a = i == 0 ? p0 : (p0 & ~127ull) + 128ull * i;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
}

// A warp's walk over the items of one type: slots j0 .. j0 + nj, width k, this warp's items
// q = q0, q0 + dq, ... < items (slot j0 + q % nj, row pair q / nj); the load cursor (step
// ls of item lq, its two rows' bases) and, for the compute side, the item and step each of
// the QD_DEPTH slots in flight holds.
template <int TY>
struct QdWalk {
    int j0, nj, k, steps, dq, items, rows, r0, rg;
    const unsigned long long* tab;
    float* ys;
    int lq, ls;
    const unsigned char* w[2];
    const unsigned short* wd[2];
    int gq[QD_DEPTH], gs[QD_DEPTH];

    // A row's bytes of quants (Q4_K: whole super-blocks; Q8_0's scales lie after all rows).
    __device__ __forceinline__ i64 row_bytes() const {
        return TY == QT_Q8_0 ? (i64)k : (i64)(k >> 8) * 144;
    }

    // Row r (0, 1) of item q's pair, clamped to the last row.
    __device__ __forceinline__ int row_of(int q, int r) const {
        return min(r0 + 2 * (q / nj) + r, rows - 1);
    }

    // The rows of item lq, after skipping (zeros into ys) those whose matrix is not held.
    __device__ __forceinline__ void seek(int lane) {
        for (; lq < items; lq += dq) {
            const unsigned char* base = (const unsigned char*)tab[j0 + lq % nj];
            if (base != nullptr) {
                const unsigned short* wdb = (const unsigned short*)(base + (i64)rows * k);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = row_of(lq, r);
                    w[r] = base + row * row_bytes();
                    wd[r] = wdb + (i64)row * (k >> 5);
                }
                return;
            }
            if (lane == 0) {
                float* y = ys + (j0 + lq % nj) * rg + 2 * (lq / nj);
                y[0] = 0.f;
                y[1] = 0.f;
            }
        }
    }

    // Every 128-byte line of the rows of this warp's items after its first (whose first steps
    // the loads have requested) into L2 (prefetch.global.L2; flags bit 2): the block's weights
    // stream from HBM while it waits for the grid before and quantizes act, where the loads
    // in flight (QD_DEPTH steps a warp) cover 4 KB of a warp's ~12.
    __device__ __forceinline__ void prefetch_rest(int q0, int lane) const {
        const i64 rb = row_bytes();
        for (int q = q0 + dq; q < items; q += dq) {
            const unsigned char* base = (const unsigned char*)tab[j0 + q % nj];
            if (base == nullptr) continue;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = row_of(q, r);
                qd_prefetch_span(base + row * rb, rb, lane);
                if (TY == QT_Q8_0)
                    qd_prefetch_span(base + (i64)rows * k + (i64)row * (k >> 4), k >> 4, lane);
            }
        }
    }

    // The load cursor's step into st (qmv_load_step, as qmv_t loads), noted in slot d, and
    // advances; past the last item it notes none.
    __device__ __forceinline__ void load(QmvStep<TY, 2, 2>& st, int d, int lane) {
        gq[d] = lq;
        gs[d] = ls;
        if (lq >= items) return;
        qmv_load_step<TY, 2, 2>(st, w, wd, ls, lane, k);
        if (++ls == steps) {
            ls = 0;
            lq += dq;
            seek(lane);
        }
    }
};

// Step s of an item of width k at x offset xo against the quantized x (qmv_t's sums for
// NQ = 2, MT = 1).
template <int TY>
__device__ __forceinline__ void qd_step(int k, int xo0, int s, int lane,
                                        const QmvStep<TY, 2, 2>& cur, const signed char* xq,
                                        const float* xd, const float* xs, float* acc) {
    if (TY == QT_Q8_0) {
        const int c = s * 1024 + lane * 32;
        if (c < k) {
            const signed char* xv = xq + xo0 + c;
            const uint4 x0 = *(const uint4*)xv, x1 = *(const uint4*)(xv + 16);
            const float dx = xd[(xo0 + c) >> 5];
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
        if (sb < (k >> 8)) {
            const int xo = xo0 + sb * 256 + 64 * h, bi = xo >> 5;
            const uint4* xv = (const uint4*)(xq + xo);
            const uint4 xa0 = xv[0], xa1 = xv[1], xb0 = xv[2], xb1 = xv[3];
            const float dx0 = xd[bi], dx1 = xd[bi + 1] * 0.0625f;  // hi nibbles: 16 q
            const float sx0 = xs[bi], sx1 = xs[bi + 1];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float d0, d1, m0, m1;
                q4k_pair(cur.hd[r], h, d0, d1, m0, m1);
                int s0 = dp4a4(nib_lo(cur.q[r][0]), xa0, 0);
                int s1 = dp4a4_hi16(cur.q[r][0], xb0, 0);
                s0 = dp4a4(nib_lo(cur.q[r][1]), xa1, s0);
                s1 = dp4a4_hi16(cur.q[r][1], xb1, s1);
                float a = acc[r];
                a = fmaf((float)s0, d0 * dx0, a);
                a = fmaf((float)s1, d1 * dx1, a);
                a = fmaf(-m0, sx0, a);
                acc[r] = fmaf(-m1, sx1, a);
            }
        }
    }
}

// The compute side of a walk (after x is quantized): each step in load order, the step
// QD_DEPTH ahead requested before it is computed; an item's sums into ys at its last step.
template <int TY>
__device__ __forceinline__ void qd_run(QdWalk<TY>& wk, QmvStep<TY, 2, 2>* pre, int f, int lane,
                                       const signed char* xq, const float* xd, const float* xs) {
    float acc[2] = {0.f, 0.f};
    for (bool more = true; more;) {
#pragma unroll
        for (int d = 0; d < QD_DEPTH; d++) {
            if (wk.gq[d] >= wk.items) {
                more = false;
                break;
            }
            const QmvStep<TY, 2, 2> cur = pre[d];
            const int q = wk.gq[d], s = wk.gs[d];
            wk.load(pre[d], d, lane);
            const int j = wk.j0 + q % wk.nj;
            qd_step<TY>(wk.k, j * f, s, lane, cur, xq, xd, xs, acc);
            if (s == wk.steps - 1) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float t = warp_sum(acc[r]);
                    acc[r] = 0.f;
                    if (lane == 0) wk.ys[j * wk.rg + 2 * (q / wk.nj) + r] = t;
                }
            }
        }
    }
}

// A warp's walk: its role's items, the first QD_DEPTH steps requested now.
template <int TY>
__device__ __forceinline__ void qd_start(QdWalk<TY>& wk, QmvStep<TY, 2, 2>* pre, int j0, int nj,
                                         int k, int q0, int dq, int rg, int rows, int r0,
                                         const unsigned long long* tab, float* ys, int lane) {
    wk.j0 = j0;
    wk.nj = nj;
    wk.k = k;
    wk.steps = qd_steps<TY>(k);
    wk.dq = dq;
    wk.items = nj * (rg / 2);
    wk.rows = rows;
    wk.r0 = r0;
    wk.rg = rg;
    wk.tab = tab;
    wk.ys = ys;
    wk.lq = q0;
    wk.ls = 0;
    wk.seek(lane);
#pragma unroll
    for (int d = 0; d < QD_DEPTH; d++) wk.load(pre[d], d, lane);
}

// Warps of NW that walk the shared items: their share of the items, at least one.
__device__ __forceinline__ int qd_shared_warps(int nw, int ck) {
    return max(1, (nw + ck / 2) / (ck + 1));
}

template <int TA, int TB, int RG, int NW>
__device__ __forceinline__ void qmv_down_comb_t(const unsigned long long* __restrict__ w_ptrs,
                                                int first, int held, const int* __restrict__ ids,
                                                int ck, const float* __restrict__ cw,
                                                const bf16* __restrict__ act, int f,
                                                unsigned long long ws, int fs, int rows,
                                                float* __restrict__ out, int flags) {
    extern __shared__ __align__(16) unsigned char qd_smem[];
    // x: xq [n] int8, xd [n / 32], xs [n / 32]; the item sums ys [ck + 1][RG]; the slots'
    // matrices tab [ck + 1]
    const int n = ck * f + fs, nb = n >> 5;
    signed char* xq = (signed char*)qd_smem;
    float* xd = (float*)(qd_smem + n);
    float* xs = xd + nb;
    float* ys = xs + nb;
    // (n % 32 == 0: every region starts 8-byte aligned)
    unsigned long long* tab = (unsigned long long*)(ys + (ck + 1) * RG);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = blockIdx.x * RG;
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
    const int nws = qd_shared_warps(NW, ck), nwr = NW - nws;
    const bool routed = warp < nwr;
    // one step record for either role (the same layout whatever the type; Q8_0 reads hd's
    // .x): two arrays would both be live where the roles meet, at the quantization below
    QmvStep<TA, 2, 2> pa[QD_DEPTH];
    QmvStep<TB, 2, 2>* pb = (QmvStep<TB, 2, 2>*)pa;
    QdWalk<TA> wa;
    QdWalk<TB> wb;
    if (routed)
        qd_start<TA>(wa, pa, 0, ck, f, warp, nwr, RG, rows, r0, tab, ys, lane);
    else
        qd_start<TB>(wb, pb, ck, 1, fs, warp - nwr, nws, RG, rows, r0, tab, ys, lane);
    if (flags & 4) {
        if (routed)
            wa.prefetch_rest(warp, lane);
        else
            wb.prefetch_rest(warp - nwr, lane);
    }
    if (early) MLA_PDL();
#ifndef QD_LAB_NOQ  // a timing lab (MLASERVE_KERNEL_DEFINES=-DQD_LAB_NOQ): x never made, wrong sums
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        q8_block(act + b * 32, xq + b * 32, xd[b], xs[b]);
#endif
    __syncthreads();
    if (routed)
        qd_run<TA>(wa, pa, f, lane, xq, xd, xs);
    else
        qd_run<TB>(wb, pb, f, lane, xq, xd, xs);
    __syncthreads();
    // a thread a row: the routed slots in order (moe_combine_pairs's sum), then the shared
    // product, as `_comb` adds them
    const int row = r0 + threadIdx.x;
    if ((int)threadIdx.x < RG && row < rows) {
        float c = 0.f;
        for (int j = 0; j < ck; j++) c += cw[j] * ys[j * RG + threadIdx.x];
        float* o = out + row;
        const float o1 = *o + c;
        *o = o1 + ys[ck * RG + threadIdx.x];
    }
}

// qmv_down_comb_<routed type>_<shared type>: 8 rows a block of 8 warps, two blocks an SM;
// `_r16`: 16 rows a block of 16 warps, one block an SM (x quantized half as many times).
#define QMV_DOWN_COMB(TAN, TA, TBN, TB, SUF, RG, NW, MINB)                                      \
    extern "C" __global__ void __launch_bounds__(32 * NW, MINB)                                 \
        qmv_down_comb_##TAN##_##TBN##SUF(const unsigned long long* w_ptrs, int first, int held, \
                                         const int* ids, int ck, const float* cw,               \
                                         const bf16* act, int f, unsigned long long ws, int fs, \
                                         int rows, float* out, int flags) {                     \
        MLA_WEIGHTS_FIRST(); /* waits after the early lookups and loads (flags bit 1) */        \
        qmv_down_comb_t<TA, TB, RG, NW>(w_ptrs, first, held, ids, ck, cw, act, f, ws, fs, rows, \
                                        out, flags);                                            \
    }
#define QMV_DOWN_COMB2(TAN, TA, TBN, TB)              \
    QMV_DOWN_COMB(TAN, TA, TBN, TB, , 8, 8, 2)        \
    QMV_DOWN_COMB(TAN, TA, TBN, TB, _r16, 16, 16, 1)
QMV_DOWN_COMB2(q8_0, QT_Q8_0, q8_0, QT_Q8_0)
QMV_DOWN_COMB2(q8_0, QT_Q8_0, q4_k, QT_Q4_K)
QMV_DOWN_COMB2(q4_k, QT_Q4_K, q4_k, QT_Q4_K)
QMV_DOWN_COMB2(q4_k, QT_Q4_K, q8_0, QT_Q8_0)
