// MoE on the GPU for small batches: routing (DeepSeek/GLM rules, the CPU's `route`) and
// expert GEMVs over (token, slot) pairs, so a decode step needs no host round trip.

// Routing of one token per block (blockDim 256, E <= 1024): logits [T, E] f32 ->
// ids [T, K + ns] (i32, best first) and weights [T, K + ns] f32. gating 0 = softmax,
// 1 = sigmoid; bias (may be null) only selects; groups as in the CPU path; ties to the lower
// index. The last ns slots of each token are the shared-expert slices: ids E + j, weight 1.
extern "C" __global__ void moe_route(const float* logits, const float* bias, int e, int k,
                                     int ns, int gating, int n_group, int topk_group, int norm,
                                     float scale, int* ids, float* weights) {
    MLA_PDL();
    const int ko = k + ns;
    ids += (i64)blockIdx.x * ko;
    weights += (i64)blockIdx.x * ko;
    if (threadIdx.x < ns) {
        ids[k + threadIdx.x] = e + threadIdx.x;
        weights[k + threadIdx.x] = 1.f;
    }
    __shared__ float sc[1024];
    __shared__ float ch[1024];
    __shared__ float red[32];
    __shared__ float gsc[64];
    __shared__ int best_i;
    const float* lg = logits + (i64)blockIdx.x * e;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < e; i += blockDim.x) mx = fmaxf(mx, lg[i]);
    mx = block_max(mx, red);
    float sum = 0.f;
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        float s = gating == 0 ? expf(lg[i] - mx) : 1.f / (1.f + expf(-lg[i]));
        sc[i] = s;
        sum += s;
    }
    sum = block_sum(sum, red);
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        if (gating == 0) sc[i] = sc[i] / sum;
        ch[i] = sc[i] + ((gating == 1 && bias) ? bias[i] : 0.f);
    }
    __syncthreads();
    if (n_group > 1 && topk_group < n_group) {
        int per = e / n_group;
        if (threadIdx.x < n_group) {
            const float* g = ch + threadIdx.x * per;
            float a = -INFINITY, b = -INFINITY;  // top two, for sigmoid's sum of top-2
            for (int i = 0; i < per; i++) {
                if (g[i] > a) { b = a; a = g[i]; }
                else if (g[i] > b) b = g[i];
            }
            gsc[threadIdx.x] = gating == 0 ? a : a + (per > 1 ? b : 0.f);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // keep the topk_group best groups (ties to the lower group); mark others -inf
            unsigned long long keep = 0;
            for (int r = 0; r < topk_group; r++) {
                int bi = -1;
                for (int gi = 0; gi < n_group; gi++)
                    if (!((keep >> gi) & 1ull) && (bi < 0 || gsc[gi] > gsc[bi])) bi = gi;
                keep |= 1ull << bi;
            }
            for (int gi = 0; gi < n_group; gi++) gsc[gi] = ((keep >> gi) & 1ull) ? 1.f : 0.f;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < e; i += blockDim.x)
            if (gsc[i / per] == 0.f) ch[i] = -INFINITY;
        __syncthreads();
    }
    float wsum = 0.f;
    for (int r = 0; r < k; r++) {
        // argmax of ch, ties to the lower index
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < e; i += blockDim.x)
            if (ch[i] > bv || (ch[i] == bv && i < bi)) { bv = ch[i]; bi = i; }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        __shared__ float wv[32];
        __shared__ int wi[32];
        int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        if (lane == 0) { wv[w] = bv; wi[w] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = wv[0];
            int ii = wi[0];
            for (int j = 1; j < (int)(blockDim.x >> 5); j++)
                if (wv[j] > v || (wv[j] == v && wi[j] < ii)) { v = wv[j]; ii = wi[j]; }
            if (ii >= e) ii = 0;  // only for e == 0, which a config never has
            best_i = ii;
            ids[r] = ii;
            weights[r] = sc[ii];
            ch[ii] = -INFINITY;
        }
        __syncthreads();
        wsum += sc[best_i];
    }
    if (threadIdx.x == 0) {
        float inv = norm ? 1.f / (wsum + 1e-20f) : 1.f;
        for (int r = 0; r < k; r++) weights[r] *= inv * scale;
    }
}

// One warp's dot of a bf16 row w [n] with x [n] (n a multiple of 8, 16-byte aligned), lane
// `lane` taking every 32nd group of 8; the warp sum is in every lane. The expert GEMVs below
// all use it, so the fused kernels give exactly the unfused ones' sums.
__device__ __forceinline__ float warp_row_dot(const bf16* w, const bf16* x, int n, int lane) {
    float acc = 0.f;
    for (int i = lane * 8; i < n; i += 32 * 8) {
        uint4 a = *(const uint4*)(w + i);
        uint4 b = *(const uint4*)(x + i);
        const bf16* aa = (const bf16*)&a;
        const bf16* bb = (const bf16*)&b;
#pragma unroll
        for (int j = 0; j < 8; j++) acc += bf2f(aa[j]) * bf2f(bb[j]);
    }
    return warp_sum(acc);
}

// The expert of pair p as a pointer, or null where it is not held here (or has no pointer).
__device__ __forceinline__ const bf16* pair_expert(const unsigned long long* w_ptrs, int first,
                                                   int held, const int* ids, int p) {
    int ex = ids[p] - first;
    if (ex < 0 || ex >= held) return nullptr;
    return (const bf16*)w_ptrs[ex];
}

// Expert GEMV over pairs: out[p, row] = W_{ids[p]}[row, :] . x[p / x_div, :], W bf16 [rows, n]
// (pointer table `w_ptrs` per expert, index minus `first`; a pair whose expert is not held
// here, or has no pointer, gets zeros). x bf16. grid (ceil(rows / 8), pairs), block 256:
// a warp per output row, 16-byte loads (n a multiple of 8).
extern "C" __global__ void moe_gemv(const unsigned long long* w_ptrs, int first, int held,
                                    const int* ids, const bf16* x, int x_div, int n, int rows,
                                    float* out) {
    MLA_PDL();
    int p = blockIdx.y, lane = threadIdx.x & 31;
    int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= rows) return;
    const bf16* w = pair_expert(w_ptrs, first, held, ids, p);
    float acc = w ? warp_row_dot(w + (i64)row * n, x + (i64)(p / x_div) * n, n, lane) : 0.f;
    if (lane == 0) out[(i64)p * rows + row] = acc;
}

// Whether pair p is the first of the pairs [0, p] with its expert id (its "leader"): the
// fused kernels below read each expert once for all the pairs that chose it (a decode step of
// t tokens has at most t pairs an expert, one a token; shared slices are taken by every
// token), instead of once a pair.
__device__ __forceinline__ bool pair_leads(const int* ids, int p) {
    int e = ids[p];
    for (int q = 0; q < p; q++)
        if (ids[q] == e) return false;
    return true;
}

// The next up to 4 pairs from `from` (inclusive) with expert id e, into mem; their count.
// (mem is only written at constant indices, so it stays in registers.)
__device__ __forceinline__ int pair_members(const int* ids, int pairs, int e, int& from,
                                            int (&mem)[4]) {
    int nm = 0;
    for (; from < pairs && nm < 4; from++) {
        if (ids[from] != e) continue;
#pragma unroll
        for (int m = 0; m < 4; m++)
            if (m == nm) mem[m] = from;
        nm++;
    }
    return nm;
}

// Expert gate|up GEMV with the SwiGLU in its epilogue: act[p, i] = bf16(silu(g) * u) with
// g = W[i, :] . x, u = W[f + i, :] . x, W = the gate|up [2f, n] of expert ids[p], x row
// p / x_div — bit for bit moe_gemv (rows 2f) then silu_mul_bf16. Pairs not held get 0.
// grid (ceil(f / 8), pairs), block 256: a warp per i; the block of a pair that leads its
// expert computes every pair of that expert (4 at a time, both rows' loads in flight
// together, each weight read once), the others exit.
extern "C" __global__ void moe_gemv_swiglu(const unsigned long long* w_ptrs, int first,
                                           int held, const int* ids, const bf16* x, int x_div,
                                           int n, int f, int pairs, bf16* act) {
    MLA_PDL();
    int p = blockIdx.y, lane = threadIdx.x & 31;
    int i = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (i >= f || !pair_leads(ids, p)) return;
    const bf16* w = pair_expert(w_ptrs, first, held, ids, p);
    const bf16* wg = w + (i64)i * n;
    const bf16* wu = w + (i64)(f + i) * n;
    int mem[4];
    for (int from = p, nm; (nm = pair_members(ids, pairs, ids[p], from, mem)) > 0;) {
        float g[4] = {0.f, 0.f, 0.f, 0.f}, u[4] = {0.f, 0.f, 0.f, 0.f};
        const bf16* xr[4];
#pragma unroll
        for (int m = 0; m < 4; m++) xr[m] = x + (i64)((m < nm ? mem[m] : mem[0]) / x_div) * n;
        if (w) {
            for (int c = lane * 8; c < n; c += 32 * 8) {
                uint4 a = *(const uint4*)(wg + c);
                uint4 b = *(const uint4*)(wu + c);
                const bf16* aa = (const bf16*)&a;
                const bf16* bb = (const bf16*)&b;
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    if (m < nm) {
                        uint4 xx = *(const uint4*)(xr[m] + c);
                        const bf16* xe = (const bf16*)&xx;
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            g[m] += bf2f(aa[j]) * bf2f(xe[j]);
                            u[m] += bf2f(bb[j]) * bf2f(xe[j]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < 4; m++) {
            if (m < nm) {
                float gs = warp_sum(g[m]), us = warp_sum(u[m]);
                if (lane == 0) act[(i64)mem[m] * f + i] = f2bf(gs / (1.f + __expf(-gs)) * us);
            }
        }
    }
}

// R rows of one warp against up to 4 x rows (xs[m], m < nm), each sum exactly as
// warp_row_dot sums one row (so bit-identical to it), all loads of a step in flight together:
// out[r][m] = (w + r * n) . xs[m].
template <int R>
__device__ __forceinline__ void warp_rows_dot(const bf16* w, const bf16* const* xs, int nm,
                                              int n, int lane, float (*out)[4]) {
    float acc[R][4];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < 4; m++) acc[r][m] = 0.f;
    for (int i = lane * 8; i < n; i += 32 * 8) {
        uint4 a[R];
#pragma unroll
        for (int r = 0; r < R; r++) a[r] = *(const uint4*)(w + (i64)r * n + i);
#pragma unroll
        for (int m = 0; m < 4; m++) {
            if (m < nm) {
                uint4 b = *(const uint4*)(xs[m] + i);
                const bf16* bb = (const bf16*)&b;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const bf16* aa = (const bf16*)&a[r];
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[r][m] += bf2f(aa[j]) * bf2f(bb[j]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < 4; m++)
            if (m < nm) out[r][m] = warp_sum(acc[r][m]);
}

// Expert down GEMV with the combine in its epilogue: x[t, row] += sum_j w[t*k + j] *
// (W_{ids[t*k + j]}[row, :] . act[t*k + j, :]) for every token t < T, W bf16 [rows, n] —
// bit for bit moe_gemv (x_div 1) then moe_combine_pairs, without the [pairs, rows]
// intermediate. Pairs not held add nothing. grid (ceil(rows / 4)), block 256: the block's 4
// rows (the last block's sit lower, inside W) for all pairs — warp w takes the pairs w,
// w + 8, ... that lead their expert and computes every pair of that expert (each weight read
// once) into shared memory; then a thread per (token, row) adds its slots in order.
// T * k <= 256 and T <= 64. (A row a block, a warp a pair, was 1.3x slower at 1 token and
// 1.9x at 4: session 7, run 5.)
extern "C" __global__ void __launch_bounds__(256, 3)
    moe_gemv_combine(const unsigned long long* w_ptrs, int first, int held, const int* ids,
                     const bf16* act, const float* wts, int t_count, int k, int n, int rows,
                     float* x) {
    MLA_PDL();
    __shared__ float y[256][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pairs = t_count * k;
    const int r0 = rows >= 4 ? min((int)blockIdx.x * 4, rows - 4) : 0;
    const int nr = min(4, rows);
    for (int j = warp; j < pairs; j += 8) {
        if (!pair_leads(ids, j)) continue;
        const bf16* w = pair_expert(w_ptrs, first, held, ids, j);
        int mem[4];
        for (int from = j, nm; (nm = pair_members(ids, pairs, ids[j], from, mem)) > 0;) {
            float d[4][4];
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int m = 0; m < 4; m++) d[r][m] = 0.f;
            const bf16* xs[4];
#pragma unroll
            for (int m = 0; m < 4; m++) xs[m] = act + (i64)(m < nm ? mem[m] : mem[0]) * n;
            if (w && nr == 4) {
                warp_rows_dot<4>(w + (i64)r0 * n, xs, nm, n, lane, d);
            } else if (w) {
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int m = 0; m < 4; m++)
                        if (r < nr && m < nm)
                            d[r][m] = warp_row_dot(w + (i64)(r0 + r) * n, xs[m], n, lane);
            }
            if (lane == 0) {
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        if (m < nm) y[mem[m]][r] = d[r][m];
            }
        }
    }
    __syncthreads();
    const int tt = threadIdx.x >> 2, rr = threadIdx.x & 3;
    const int row = blockIdx.x * 4 + rr;
    if (tt < t_count && row < rows) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) acc += wts[tt * k + j] * y[tt * k + j][row - r0];
        x[(i64)tt * rows + row] += acc;
    }
}

// x[t, :] += sum_j w[t, j] * y[t*k + j, :] (pairs in token order).
// grid (T, ceil(h / 256)), block 256: a thread per element.
extern "C" __global__ void moe_combine_pairs(float* x, const float* y, const float* w, int k,
                                             int h) {
    MLA_PDL();
    int t = blockIdx.x;
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < h) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) acc += w[t * k + j] * y[((i64)t * k + j) * h + i];
        x[(i64)t * h + i] += acc;
    }
}
