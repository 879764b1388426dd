// MoE on the GPU for small batches: routing (DeepSeek/GLM rules, the CPU's `route`) and
// expert GEMVs over (token, slot) pairs, so a decode step needs no host round trip.

// Expert i's score before normalization: exp(logit - max) (softmax gating) or the sigmoid.
__device__ __forceinline__ float route_score(const float* lg, int i, float mx, int gating) {
    return gating == 0 ? expf(lg[i] - mx) : 1.f / (1.f + expf(-lg[i]));
}

// A group's score for group-limited routing: its best expert's (softmax), or the sum of its top
// two (sigmoid), over g [per] (ties kept: a repeated best counts twice).
__device__ __forceinline__ float group_score(const float* g, int per, int gating) {
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < per; i++) {
        if (g[i] > a) { b = a; a = g[i]; }
        else if (g[i] > b) b = g[i];
    }
    return gating == 0 ? a : a + (per > 1 ? b : 0.f);
}

// gsc [n_group] scores -> 1 for the topk_group best groups (ties to the lower group), else 0.
// One thread. n_group <= 64.
__device__ __forceinline__ void keep_groups(float* gsc, int n_group, int topk_group) {
    unsigned long long keep = 0;
    for (int r = 0; r < topk_group; r++) {
        int bi = -1;
        for (int gi = 0; gi < n_group; gi++)
            if (!((keep >> gi) & 1ull) && (bi < 0 || gsc[gi] > gsc[bi])) bi = gi;
        keep |= 1ull << bi;
    }
    for (int gi = 0; gi < n_group; gi++) gsc[gi] = ((keep >> gi) & 1ull) ? 1.f : 0.f;
}

// Routing of one token by one block (blockDim 256, E <= 1024): logits lg [E] f32 ->
// ids [K + ns] (i32, best first) and weights [K + ns] f32. gating 0 = softmax,
// 1 = sigmoid; bias (may be null) only selects; groups as in the CPU path; ties to the lower
// index. The last ns slots of each token are the shared-expert slices: ids E + j, weight 1.
__device__ void route_row(const float* lg, const float* bias, int e, int k, int ns, int gating,
                          int n_group, int topk_group, int norm, float scale, int* ids,
                          float* weights) {
    if (threadIdx.x < ns) {
        ids[k + threadIdx.x] = e + threadIdx.x;
        weights[k + threadIdx.x] = 1.f;
    }
    __shared__ float sc[1024];
    __shared__ float ch[1024];
    __shared__ float red[32];
    __shared__ float gsc[64];
    __shared__ int best_i;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < e; i += blockDim.x) mx = fmaxf(mx, lg[i]);
    mx = block_max(mx, red);
    float sum = 0.f;
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        float s = route_score(lg, i, mx, gating);
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
        if (threadIdx.x < n_group) gsc[threadIdx.x] = group_score(ch + threadIdx.x * per, per, gating);
        __syncthreads();
        // keep the topk_group best groups; the others' experts are marked -inf below
        if (threadIdx.x == 0) keep_groups(gsc, n_group, topk_group);
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


// The softmax's max and sum over lg [E] as one warp takes them (lane l: experts l, l + 32, ...,
// then warp_max / warp_sum), every lane's scores into sc; route_row_warp and route_row_rank
// both use it, so both have the same values. __fadd_rn: the sum is never fused into expf's
// last multiply.
__device__ __forceinline__ void route_softmax_warp(const float* lg, int e, int gating, float* sc,
                                                   float& mx, float& sum) {
    const int lane = threadIdx.x & 31;
    mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = lane + 32 * u;
        if (i < e) mx = fmaxf(mx, lg[i]);
    }
    mx = warp_max(mx);
    sum = 0.f;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = lane + 32 * u;
        sc[u] = 0.f;
        if (i < e) {
            sc[u] = route_score(lg, i, mx, gating);
            sum = __fadd_rn(sum, sc[u]);
        }
    }
    sum = warp_sum(sum);
}

// route_row by one warp (lanes own experts lane, lane + 32, ...; E <= 256, K <= 32, ns <= 32,
// n_group <= 64; ch [E] and gsc [n_group] are shared scratch): the same rules, sums and ties,
// with warp shuffles and __syncwarp instead of block barriers — the routing that ends
// moe_norm_route sits on the critical path of every MoE layer of a small step (route_row has
// ~20 block barriers). Same selection as route_row but for one thing: the softmax sum is
// added in another order, so two scores a rounding step apart may tie after the division in
// one and not the other (the GPU and CPU routings already differ so); weights agree to
// rounding.
__device__ void route_row_warp(const float* lg, const float* bias, int e, int k, int ns,
                               int gating, int n_group, int topk_group, int norm, float scale,
                               int* ids, float* weights, float* ch, float* gsc) {
    const int lane = threadIdx.x & 31;
    if (lane < ns) {
        ids[k + lane] = e + lane;
        weights[k + lane] = 1.f;
    }
    float sc[8], mx, sum;
    route_softmax_warp(lg, e, gating, sc, mx, sum);
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = lane + 32 * u;
        if (i < e) {
            if (gating == 0) sc[u] = sc[u] / sum;
            ch[i] = sc[u] + ((gating == 1 && bias) ? bias[i] : 0.f);
        }
    }
    __syncwarp();
    if (n_group > 1 && topk_group < n_group) {
        const int per = e / n_group;
        for (int g0 = 0; g0 < n_group; g0 += 32) {
            const int gi = g0 + lane;
            if (gi < n_group) gsc[gi] = group_score(ch + gi * per, per, gating);
        }
        __syncwarp();
        if (lane == 0) keep_groups(gsc, n_group, topk_group);
        __syncwarp();
        for (int i = lane; i < e; i += 32)
            if (gsc[i / per] == 0.f) ch[i] = -INFINITY;
        __syncwarp();
    }
    float c[8];
#pragma unroll
    for (int u = 0; u < 8; u++) c[u] = lane + 32 * u < e ? ch[lane + 32 * u] : -INFINITY;
    float wsum = 0.f, mine = 0.f;
    int mine_id = 0;
    for (int r = 0; r < k; r++) {
        // argmax of c, ties to the lower index (a lane's own entries rise with u)
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = lane + 32 * u;
            if (i < e && (c[u] > bv || (c[u] == bv && i < bi))) { bv = c[u]; bi = i; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (bi >= e) bi = 0;  // only for e == 0, which a config never has
        // The owner lane hands over the expert's score and drops it from the race.
        float s = 0.f;
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (lane + 32 * u == bi) { s = sc[u]; c[u] = -INFINITY; }
        s = __shfl_sync(0xffffffffu, s, bi & 31);
        if (lane == r) { mine = s; mine_id = bi; }
        wsum += s;
    }
    const float inv = norm ? 1.f / (wsum + 1e-20f) : 1.f;
    if (lane < k) {
        ids[lane] = mine_id;
        weights[lane] = mine * (inv * scale);
    }
}

// route_row_warp's selection by a block of 256 threads, by rank instead of k rounds of a warp
// argmax: every warp computes the softmax's max and sum as route_row_warp's warp does (the
// same values), each expert's choice score goes to ch, and expert i's rank is the count of
// experts ahead of it (a higher score, or an equal one at a lower index: the rounds' order),
// counted by g threads an expert (4 where E <= 64, 2 where E <= 128, else 1) over a 1/g slice
// each. The k ranked first are the k chosen, in the same order with the same scores, so ids
// and weights are route_row_warp's bit for bit. Returns false (only ch written) where that
// does not hold: group-limited routing (n_group > 1 with topk_group < n_group), E > 256,
// K > E, or a NaN score; the caller then routes with route_row_warp. Every thread of the block
// calls it; lg [E], ch [E], sel [2 * K] shared.
__device__ bool route_row_rank(const float* lg, const float* bias, int e, int k, int ns,
                               int gating, int n_group, int topk_group, int norm, float scale,
                               int* ids, float* weights, float* ch, float* sel) {
    const int tid = threadIdx.x;
    if ((n_group > 1 && topk_group < n_group) || e > 256 || k > e || blockDim.x != 256)
        return false;
    float scw[8], mx, sum;
    route_softmax_warp(lg, e, gating, scw, mx, sum);  // every warp: the same values
    // expert tid's score (route_row_warp's sc) and choice score
    float sc = 0.f;
    bool bad = false;
    if (tid < e) {
        sc = route_score(lg, tid, mx, gating);
        if (gating == 0) sc = sc / sum;
        const float c = sc + ((gating == 1 && bias) ? bias[tid] : 0.f);
        ch[tid] = c;
        bad = isnan(c);
    }
    if (__syncthreads_or(bad)) return false;
    const int g = e <= 64 ? 4 : e <= 128 ? 2 : 1;  // threads an expert
    const int i = tid / g, part = tid % g, span = (e + g - 1) / g;
    int ahead = 0;
    float ci = i < e ? ch[i] : 0.f;
    for (int j = part * span; j < min(e, (part + 1) * span); j++) {
        const float cj = ch[j];
        ahead += cj > ci || (cj == ci && j < i);
    }
    if (g >= 2) ahead += __shfl_xor_sync(0xffffffffu, ahead, 1);
    if (g >= 4) ahead += __shfl_xor_sync(0xffffffffu, ahead, 2);
    if (i < e && part == 0 && ahead < k) {
        // expert i's score, as its owner thread computed it above
        float s_i = route_score(lg, i, mx, gating);
        if (gating == 0) s_i = s_i / sum;
        sel[ahead] = s_i;
        sel[k + ahead] = __int_as_float(i);
    }
    __syncthreads();
    if (tid < ns) {
        ids[k + tid] = e + tid;
        weights[k + tid] = 1.f;
    }
    if (tid < k) {
        float wsum = 0.f;  // in selection order, as route_row_warp adds them
        for (int r = 0; r < k; r++) wsum += sel[r];
        const float inv = norm ? 1.f / (wsum + 1e-20f) : 1.f;
        ids[tid] = __float_as_int(sel[k + tid]);
        weights[tid] = sel[tid] * (inv * scale);
    }
    return true;
}

// Routing of one token per block: logits [T, E] -> ids / weights [T, K + ns] (route_row).
extern "C" __global__ void moe_route(const float* logits, const float* bias, int e, int k,
                                     int ns, int gating, int n_group, int topk_group, int norm,
                                     float scale, int* ids, float* weights) {
    MLA_PDL();
    const int ko = k + ns;
    route_row(logits + (i64)blockIdx.x * e, bias, e, k, ns, gating, n_group, topk_group, norm,
              scale, ids + (i64)blockIdx.x * ko, weights + (i64)blockIdx.x * ko);
}

// The one-pass norm of moe_norm_route and moe_norm_route_cl (h <= 8 * blockDim.x), after
// their wait: x row xr's 8 elements i = threadIdx.x + blockDim.x u of a thread into xv, and
// 1 / RMS with rms_inv_8's sums (so the normalized rows are bit-identical to rms_norm's).
__device__ __forceinline__ float rms_inv_regs(const float* xr, int h, float eps, float* red,
                                              float* xv) {
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = threadIdx.x + u * blockDim.x;
        xv[u] = i < h ? xr[i] : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < 8; u++) ss += xv[u] * xv[u];
    ss = block_sum(ss, red);
    return rsqrtf(ss / h + eps);
}

// moe_norm_route's step over a thread's 8 elements i0 + u * nt (< h): v = x * inv * gamma,
// stored as bf16 in hrow where `store`, dot + sum of v * router, in u order.
__device__ __forceinline__ float norm_dot_8(const float* xv, const float* gv, const float* wv,
                                            float inv, int i0, int nt, int h, bool store,
                                            bf16* hrow, float dot) {
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = i0 + u * nt;
        if (i >= h) break;
        float v = xv[u] * inv * gv[u];
        if (store) hrow[i] = f2bf(v);
        dot += v * wv[u];
    }
    return dot;
}

// The FFN norm, the router and the routing of small steps in one launch: block (j, t)
// normalizes x row t as rms_norm does (same block size and sums: the values, and hnb's bf16
// rows written by block 0, are bit-identical to its output), computes logit j = router row j
// . those values (f32, a block sum) into logits [T, E], and the last of token t's E blocks
// to finish (a ticket per token, reset by that block, so the kernel can run again and replay
// in a graph) routes it with route_row (one warp of it with route_row_warp where E <= 256).
// gamma and the router row (weights) are read before the wait on the previous grid, and for
// H <= 2,048 x is read once. grid (E, T), block 256, E <= 1024.
extern "C" __global__ void moe_norm_route(const float* x, const float* gamma, float eps, int h,
                                          const float* router, bf16* hnb, float* logits,
                                          unsigned* tickets, const float* bias, int e, int k,
                                          int ns, int gating, int n_group, int topk_group,
                                          int norm, float scale, int* ids, float* weights) {
    MLA_WEIGHTS_FIRST();
    __shared__ float red[32];
    __shared__ float lg[1024];
    __shared__ unsigned ticket;
    const int j = blockIdx.x, t = blockIdx.y;
    const float* xr = x + (i64)t * h;
    const int nt = blockDim.x;
    const float* wr = router + (i64)j * h;
    float dot = 0.f;
    if (h <= 8 * nt) {
        // One pass (h <= 2,048 at 256 threads): gamma and the router row are requested before
        // the wait, x once after it; the sums are rms_inv_8's and the loop's below, in order.
        float xv[8], gv[8], wv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = threadIdx.x + u * nt;
            gv[u] = i < h ? gamma[i] : 0.f;
            wv[u] = i < h ? wr[i] : 0.f;
        }
        MLA_PDL();
        const float inv = rms_inv_regs(xr, h, eps, red, xv);
        dot = norm_dot_8(xv, gv, wv, inv, threadIdx.x, nt, h, j == 0, hnb + (i64)t * h, dot);
    } else {
        MLA_PDL();
        const float inv = rms_inv_8(xr, h, eps, red);  // rms_norm's, 8 loads in flight
        for (int i0 = threadIdx.x; i0 < h; i0 += 8 * nt) {
            float xv[8], gv[8], wv[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int i = i0 + u * nt;
                xv[u] = i < h ? xr[i] : 0.f;
                gv[u] = i < h ? gamma[i] : 0.f;
                wv[u] = i < h ? wr[i] : 0.f;
            }
            dot = norm_dot_8(xv, gv, wv, inv, i0, nt, h, j == 0, hnb + (i64)t * h, dot);
        }
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) {
        logits[(i64)t * e + j] = dot;
        __threadfence();
        ticket = atomicAdd(tickets + t, 1u);
    }
    __syncthreads();
    if (ticket != (unsigned)(e - 1)) return;
    // The last block of token t: every logit of the token is written and visible.
    __threadfence();
    const int ko = k + ns;
    if (e <= 256 && k <= 32 && ns <= 32 && n_group <= 64) {
        // One warp routes (no block barriers on the critical path).
        if (threadIdx.x >= 32) return;
        __shared__ float ch[256];
        __shared__ float gsc[64];
        for (int i = threadIdx.x; i < e; i += 32) lg[i] = __ldcg(logits + (i64)t * e + i);
        if (threadIdx.x == 0) tickets[t] = 0u;
        __syncwarp();
        route_row_warp(lg, bias, e, k, ns, gating, n_group, topk_group, norm, scale,
                       ids + (i64)t * ko, weights + (i64)t * ko, ch, gsc);
        return;
    }
    for (int i = threadIdx.x; i < e; i += blockDim.x) lg[i] = __ldcg(logits + (i64)t * e + i);
    if (threadIdx.x == 0) tickets[t] = 0u;
    __syncthreads();
    route_row(lg, bias, e, k, ns, gating, n_group, topk_group, norm, scale, ids + (i64)t * ko,
              weights + (i64)t * ko);
}

// moe_norm_route over a thread-block cluster (sm_90): the same norm (hnb's rows bit-identical
// to rms_norm's, written by the cluster's block 0) and the same routing rules
// (route_row_warp), but each logit is one warp's dot (a warp sum, not a block sum: logits
// equal to rounding, so near-ties may route otherwise) and the logits reach the block that
// routes through distributed shared memory: no global ticket, no fence and no second trip
// through L2 between the last logit and the routing (moe_norm_route's critical path). Each
// block keeps its logits in its own lg, a cluster barrier publishes them and block 0 pulls
// them (session 34: −12 µs a V2-Lite b1 step against pushing them into block 0 before a
// release barrier); the other blocks stay until it has read them.
// grid (C, T), cluster (C, 1, 1), block 256: block r of token t takes logits
// [r*E/C, (r+1)*E/C), its warp w those of them with index w mod 8. Where that is one logit a
// warp (E == 8*C) and H <= 2,048, H % 128 == 0, the router row is read into registers before
// the wait on the previous grid. `late` bit 0: the next kernel is let in (launch_dependents)
// only after the logits' cluster barrier, not at the wait, so the expert GEMV's blocks arrive
// while block 0 routes, not while the norm and the dots run. Bit 1: block 0 routes by rank
// (route_row_rank, all its threads) where that takes the config, else one warp of it with
// route_row_warp. Bit 2 (with bit 0): block 0 fences hnb before letting the next kernel in,
// for the expert GEMV's shared slices that read it without waiting (moe_gemv_swiglu).
// The host launches it where E % C == 0, H % 4 == 0, H <= MNR_CL_MAX_H,
// E <= 256, K <= 32, ns <= 32, n_group <= 64 (route_row_warp's bounds).
#define MNR_CL_MAX_H 8192
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// moe_norm_route_cl's routing of token t by block 0 from its lg: by rank (all its threads) where
// `late` bit 1 asks and the config allows, else one warp with route_row_warp. Every thread
// returns (the caller may wait at a cluster barrier after it).
__device__ __forceinline__ void mnr_route(const float* lg, const float* bias, int e, int k, int ns,
                                          int gating, int n_group, int topk_group, int norm,
                                          float scale, int* ids, float* weights, int t, int late,
                                          int warp, float* ch, float* gsc) {
    const int ko = k + ns;
    if ((late & 2) && route_row_rank(lg, bias, e, k, ns, gating, n_group, topk_group, norm, scale,
                                     ids + (i64)t * ko, weights + (i64)t * ko, ch, gsc))
        return;
    if (warp != 0) return;
    route_row_warp(lg, bias, e, k, ns, gating, n_group, topk_group, norm, scale, ids + (i64)t * ko,
                   weights + (i64)t * ko, ch, gsc);
}
#endif
extern "C" __global__ void __launch_bounds__(256) moe_norm_route_cl(
    const float* x, const float* gamma, float eps, int h, const float* router, bf16* hnb,
    float* logits, const float* bias, int e, int k, int ns, int gating, int n_group,
    int topk_group, int norm, float scale, int* ids, float* weights, int late) {
    MLA_WEIGHTS_FIRST();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float red[32];
    __shared__ __align__(16) float xs[MNR_CL_MAX_H];
    __shared__ float lg[256];
    __shared__ float ch[256];
    __shared__ float gsc[64];
    unsigned rank, csize;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
    const int t = blockIdx.y, nt = blockDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = e / (int)csize, j0 = (int)rank * per;
    const bool one = per == 8 && h <= 2048 && (h & 127) == 0;
    float4 wv[16];
    if (one) {
        const float4* wr = (const float4*)(router + (i64)(j0 + warp) * h);
#pragma unroll
        for (int s = 0; s < 16; s++)
            if (s * 128 < h) wv[s] = wr[s * 32 + lane];
    }
    const float* xr = x + (i64)t * h;
    bf16* hrow = hnb + (i64)t * h;
    if (h <= 8 * nt) {
        // moe_norm_route's one pass: the same loads, sums and products.
        float gv[8], xv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = threadIdx.x + u * nt;
            gv[u] = i < h ? gamma[i] : 0.f;
        }
        if (late & 1) {
            MLA_PDL_WAIT();
        } else {
            MLA_PDL();
        }
        const float inv = rms_inv_regs(xr, h, eps, red, xv);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int i = threadIdx.x + u * nt;
            if (i >= h) break;
            const float v = xv[u] * inv * gv[u];
            xs[i] = v;
            if (rank == 0) hrow[i] = f2bf(v);
        }
    } else {
        if (late & 1) {
            MLA_PDL_WAIT();
        } else {
            MLA_PDL();
        }
        const float inv = rms_inv_8(xr, h, eps, red);
        for (int i = threadIdx.x; i < h; i += nt) {
            const float v = xr[i] * inv * gamma[i];
            xs[i] = v;
            if (rank == 0) hrow[i] = f2bf(v);
        }
    }
    // `late` bit 2 (set with bit 0 only, Gpu::moe_norm_route's `fence_hnb`): the expert
    // GEMV's shared slices read hnb without waiting for this grid (moe_gemv_swiglu, tab_on
    // bit 1), so each thread of block 0 fences its rows at gpu scope, before the barriers
    // that precede letting the next kernel in.
    if (rank == 0 && (late & 4)) __threadfence();
    __syncthreads();
    const float4* xs4 = (const float4*)xs;
    for (int jj = warp; jj < per; jj += 8) {
        const int j = j0 + jj;
        float d = 0.f;
        if (one) {
#pragma unroll
            for (int s = 0; s < 16; s++) {
                if (s * 128 >= h) break;
                const float4 a = xs4[s * 32 + lane];
                d += a.x * wv[s].x + a.y * wv[s].y + a.z * wv[s].z + a.w * wv[s].w;
            }
        } else {
            const float4* wr = (const float4*)(router + (i64)j * h);
            for (int i = lane; 4 * i < h; i += 32) {
                const float4 a = xs4[i], b = wr[i];
                d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
        d = warp_sum(d);
        if (lane == 0) {
            logits[(i64)t * e + j] = d;
            lg[j] = d;
        }
    }
    // Each block's logits published by a barrier after local stores, then pulled by block 0 (a
    // release over remote stores costs ~3x a plain barrier: mla_attn_cl's q_lat, session 18).
    // This barrier is the cluster's first, so every block has started before any remote read.
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    if (late & 1) MLA_PDL_LAUNCH();
    if (rank != 0) {
        // Stay until block 0 has read this block's lg.
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
        return;
    }
    for (int i = threadIdx.x; i < e; i += nt) {
        const unsigned b = (unsigned)(i / per);
        if (b != 0) lg[i] = cl_ld_f32(cl_remote(&lg[i], b));
    }
    __syncthreads();
    // The remote reads are done (their values stored above): let the other blocks go.
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    mnr_route(lg, bias, e, k, ns, gating, n_group, topk_group, norm, scale, ids, weights, t,
              late, warp, ch, gsc);
    // Not .aligned: warp 0 may come here from route_row_warp after the others.
    asm volatile("barrier.cluster.wait;\n" ::: "memory");
#else
    __trap();
#endif
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

// The expert pointer table copied into shared memory tab [held] before the wait on the
// previous grid (weights: never written by a kernel), where the host asks (`on`) and it fits
// (held <= MOE_TAB_MAX): pair_expert's lookup after the wait then reads shared memory, one
// memory round trip fewer between the routing's ids and the first weight rows. Returns the
// table to look up in (tab, else w_ptrs); a barrier after the wait makes tab visible.
#define MOE_TAB_MAX 128
__device__ __forceinline__ const unsigned long long* stage_table(const unsigned long long* w_ptrs,
                                                                 int held, int on,
                                                                 unsigned long long* tab) {
    if (!on || held > MOE_TAB_MAX) return w_ptrs;
    for (int i = threadIdx.x; i < held; i += blockDim.x) tab[i] = w_ptrs[i];
    return tab;
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

// Shared-expert slices as views (weights.rs): ids >= e_routed are slices j = id - e_routed of
// the shared MLP (intermediate fs), whose pointer-table entries point at gate row j*f of its
// gate|up [2fs, n] and at column j*f of its down [rows, fs]: a slice's up rows sit fs rows
// after its gate rows (f for a routed expert) and its down rows are fs apart (n for a routed
// expert). Without slices the caller passes fs = f.

// Four K steps (from column c0, 256 apart) of two rows w0, w1 into a, b (none past n).
__device__ __forceinline__ void load_2rows4(uint4 (&a)[4], uint4 (&b)[4], const bf16* w0,
                                            const bf16* w1, int c0, int n) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = c0 + u * 256;
        if (c < n) {
            a[u] = *(const uint4*)(w0 + c);
            b[u] = *(const uint4*)(w1 + c);
        }
    }
}

// Two rows of one warp (w0, w1, K = n) against x, each sum exactly as warp_row_dot sums one row
// (same lane steps, same order), with four K steps of both rows in flight: the loads, not the
// warps, cover the memory latency (gemv.cu). out0 = w0 . x, out1 = w1 . x, in every lane.
__device__ __forceinline__ void warp_2rows_dot(const bf16* w0, const bf16* w1, const bf16* x,
                                               int n, int lane, float& out0, float& out1) {
    float s0 = 0.f, s1 = 0.f;
    for (int c0 = lane * 8; c0 < n; c0 += 4 * 32 * 8) {
        uint4 a[4], b[4];
        load_2rows4(a, b, w0, w1, c0, n);
        dot2_steps4(a, b, x, c0, n, s0, s1);  // x is small and shared by all warps: L1
    }
    out0 = warp_sum(s0);
    out1 = warp_sum(s1);
}

// warp_2rows_dot whose first four K steps of both rows (a, b: load_2rows4 at lane * 8) were
// loaded already: the same sums, bit for bit.
__device__ __forceinline__ void warp_2rows_dot_from(uint4 (&a)[4], uint4 (&b)[4],
                                                    const bf16* w0, const bf16* w1,
                                                    const bf16* x, int n, int lane,
                                                    float& out0, float& out1) {
    float s0 = 0.f, s1 = 0.f;
    for (int c0 = lane * 8; c0 < n; c0 += 4 * 32 * 8) {
        if (c0 != lane * 8) load_2rows4(a, b, w0, w1, c0, n);
        dot2_steps4(a, b, x, c0, n, s0, s1);
    }
    out0 = warp_sum(s0);
    out1 = warp_sum(s1);
}

// Expert gate|up GEMV with the SwiGLU in its epilogue: act[p, i] = bf16(silu(g) * u) with
// g = W[i, :] . x, u = W[up + i, :] . x (up = f, or fs for a slice), W = the gate|up of expert
// ids[p], x row p / x_div — bit for bit moe_gemv (rows 2f) then silu_mul_bf16. Pairs not held
// get 0. grid (ceil(f / 8), pairs), block 256: a warp per i, its gate and up rows together.
// Each pair reads its expert: meant for one token, whose pairs are distinct experts.
//
// Shared slices early (k_routed < x_div, pairs = tokens * x_div): each token's last x_div -
// k_routed pairs are the slices, whose ids the routing writes as e_routed + j (route_row).
// Their blocks come first in grid.y (so they are the ones resident while the routing kernel
// before this one runs) and load their first four K steps of both rows before the PDL wait:
// neither the pointer table nor the weights depend on that kernel. After the wait a block
// whose id is not e_routed + j after all reloads (the same sums either way). k_routed =
// x_div: pairs in order, nothing early.
extern "C" __global__ void moe_gemv_swiglu(const unsigned long long* w_ptrs, int first,
                                           int held, const int* ids, const bf16* x, int x_div,
                                           int n, int f, int e_routed, int fs, int k_routed,
                                           bf16* act, int tab_on) {
    MLA_WEIGHTS_FIRST();  // the slices' pointers and weights are read before the wait
    const int lane = threadIdx.x & 31, i = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int ns = x_div - k_routed, tokens = gridDim.y / x_div, y = blockIdx.y;
    int p = y, slice = -1;
    if (ns > 0) {
        if (y < tokens * ns) {
            slice = y % ns;
            p = (y / ns) * x_div + k_routed + slice;
        } else {
            p = ((y - tokens * ns) / k_routed) * x_div + (y - tokens * ns) % k_routed;
        }
    }
    uint4 a[4], b[4];
    const bf16* we = nullptr;
    if (slice >= 0 && i < f) {
        const int ex = e_routed + slice - first;
        we = ex >= 0 && ex < held ? (const bf16*)w_ptrs[ex] : nullptr;
        if (we) load_2rows4(a, b, we + (i64)i * n, we + (i64)(fs + i) * n, lane * 8, n);
    }
    // tab_on bit 1 (Gpu::shared_nowait): the kernel before is moe_norm_route_cl, which
    // let this grid in after writing and fencing x's rows (hnb), so a slice's block — needing
    // no id — reads its row (ld.global.cg: never a line an earlier layer left in L1) into
    // shared memory and runs without the wait; the routed blocks still wait, so the kernel
    // after this one still starts only once the routing has completed. Same sums, same bits.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the cluster routing's GPUs
    __shared__ __align__(16) bf16 x_early[MNR_CL_MAX_H];
    const int ex_s = e_routed + slice - first;
    if ((tab_on & 2) && slice >= 0 && n <= MNR_CL_MAX_H && ex_s >= 0 && ex_s < held &&
        w_ptrs[ex_s] != 0ull) {
        const bf16* xr = x + (i64)(p / x_div) * n;
        for (int c = threadIdx.x * 8; c < n; c += blockDim.x * 8) {
            uint4 v;
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "l"(xr + c));
            *(uint4*)&x_early[c] = v;
        }
        __syncthreads();
        MLA_PDL_LAUNCH();
        if (i >= f) return;
        float g = 0.f, u = 0.f;
        warp_2rows_dot_from(a, b, we + (i64)i * n, we + (i64)(fs + i) * n, x_early, n, lane, g, u);
        if (lane == 0) act[(i64)p * f + i] = f2bf(g / (1.f + __expf(-g)) * u);
        return;
    }
#endif
    tab_on &= 1;
    __shared__ unsigned long long tab_s[MOE_TAB_MAX];
    const unsigned long long* tab = stage_table(w_ptrs, held, tab_on, tab_s);
    MLA_PDL();
    if (tab != w_ptrs) __syncthreads();
    if (i >= f) return;
    const bf16* w = pair_expert(tab, first, held, ids, p);
    float g = 0.f, u = 0.f;
    if (w) {
        const int up = ids[p] >= e_routed ? fs : f;
        const bf16* xr = x + (i64)(p / x_div) * n;
        if (we != nullptr && ids[p] == e_routed + slice)
            warp_2rows_dot_from(a, b, w + (i64)i * n, w + (i64)(up + i) * n, xr, n, lane, g, u);
        else
            warp_2rows_dot(w + (i64)i * n, w + (i64)(up + i) * n, xr, n, lane, g, u);
    }
    if (lane == 0) act[(i64)p * f + i] = f2bf(g / (1.f + __expf(-g)) * u);
}

// Expert down GEMV with the combine in its epilogue: x[t, row] += sum_j w[t*k + j] *
// (W_{ids[t*k + j]}[row, :] . act[t*k + j, :]) for every token t < T, W bf16 rows of n values
// (n apart, fs for a slice) — bit for bit moe_gemv (x_div 1) then moe_combine_pairs, without
// the [pairs, rows] intermediate. Pairs not held add nothing. grid (ceil(rows / RG)), block
// 256: the block's RG rows (the last block's sit lower, inside W) for all pairs, as items of
// (pair, row pair) that warp w takes w, w + 8, ... (two rows, four K steps in flight) into
// shared memory; then a thread per (token, row) adds its slots in order. T * k <= 256.
// RG = 4 (moe_gemv_combine) gives 2 items a warp for V2-Lite's 8 pairs at 4 blocks an SM;
// RG = 8 (moe_gemv_combine_r8) 4 items at 2 blocks an SM (session 8, run 1: 22 µs a layer).
//
// tab_on bit 0: the pointer table staged in shared memory (stage_table). Bit 1 (the host
// vouches, Gpu::moe_gemv_combine_after): ids are final before this grid's wait — the kernel
// before is the SwiGLU GEMV over the same ids, whose routed blocks let this grid in only after
// their own wait, i.e. once the routing that wrote ids has completed — so each warp loads its
// first item's first four K steps before the wait (ids through L2, ld.global.cg: never a line
// an earlier layer left in L1; w_ptrs is never written), while the SwiGLU kernel's tail
// still runs (common.cuh's third exception). act, wts, x and the loop's own reads of ids come
// after the wait. The same sums either way.

// Item `it` of a block: pair j and rows ra, rb (an odd last row twice) of the block's RG rows
// from r0 (nr of them).
struct CombineItem {
    int j, ra, rb;
};
__device__ __forceinline__ CombineItem combine_item(int it, int r0, int nr) {
    const int halves = (nr + 1) / 2, j = it / halves, ra = r0 + 2 * (it % halves);
    return {j, ra, min(ra + 1, r0 + nr - 1)};
}

// The first item of this warp, its first four K steps of both rows into a, b before the wait
// (tab_on bit 1). True where loaded (a held expert with a pointer).
template <int RG>
__device__ __forceinline__ bool combine_first_load(uint4 (&a)[4], uint4 (&b)[4],
                                                   const unsigned long long* w_ptrs, int first,
                                                   int held, const int* ids, int pairs, int n,
                                                   int rows, int e_routed, int fs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = rows >= RG ? min((int)blockIdx.x * RG, rows - RG) : 0;
    const int nr = min(RG, rows);
    if (warp >= pairs * ((nr + 1) / 2)) return false;
    const CombineItem c = combine_item(warp, r0, nr);
    const int id = ld_cg_s32(ids + c.j), ex = id - first;
    const bf16* w = ex >= 0 && ex < held ? (const bf16*)w_ptrs[ex] : nullptr;
    if (!w) return false;
    const i64 ld = id >= e_routed ? fs : n;
    load_2rows4(a, b, w + c.ra * ld, w + c.rb * ld, lane * 8, n);
    return true;
}

// `pre`: a, b hold this warp's first item's first four K steps (combine_first_load).
template <int RG>
__device__ __forceinline__ void gemv_combine_body(const unsigned long long* w_ptrs, int first,
                                                  int held, const int* ids, const bf16* act,
                                                  const float* wts, int t_count, int k, int n,
                                                  int rows, int e_routed, int fs, float* x,
                                                  uint4 (&a)[4], uint4 (&b)[4], bool pre) {
    __shared__ float y[256][RG];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pairs = t_count * k;
    const int r0 = rows >= RG ? min((int)blockIdx.x * RG, rows - RG) : 0;
    const int nr = min(RG, rows), halves = (nr + 1) / 2;
    for (int it = warp; it < pairs * halves; it += 8) {
        const CombineItem c = combine_item(it, r0, nr);
        const bf16* w = pair_expert(w_ptrs, first, held, ids, c.j);
        float da = 0.f, db = 0.f;
        if (w) {
            const i64 ld = ids[c.j] >= e_routed ? fs : n;
            const bf16 *wa = w + c.ra * ld, *wb = w + c.rb * ld;
            // one path, so the first round's registers are the loop's (no second set live)
            if (!(pre && it == warp)) load_2rows4(a, b, wa, wb, lane * 8, n);
            warp_2rows_dot_from(a, b, wa, wb, act + (i64)c.j * n, n, lane, da, db);
        }
        if (lane == 0) {
            y[c.j][c.ra - r0] = da;
            y[c.j][c.rb - r0] = db;
        }
    }
    __syncthreads();
    for (int o = threadIdx.x; o < t_count * RG; o += blockDim.x) {
        const int tt = o / RG, rr = o % RG;
        const int row = blockIdx.x * RG + rr;
        if (row >= rows || rr >= nr) continue;
        float acc = 0.f;
        for (int j = 0; j < k; j++) acc += wts[tt * k + j] * y[tt * k + j][row - r0];
        x[(i64)tt * rows + row] += acc;
    }
}

#define MOE_GEMV_COMBINE(NAME, RG)                                                              \
    extern "C" __global__ void NAME(const unsigned long long* w_ptrs, int first, int held,     \
                                    const int* ids, const bf16* act, const float* wts,         \
                                    int t_count, int k, int n, int rows, int e_routed, int fs, \
                                    float* x, int tab_on) {                                    \
        MLA_WEIGHTS_FIRST();  /* with tab_on bit 1 the first weights before the wait */        \
        __shared__ unsigned long long tab_s[MOE_TAB_MAX];                                      \
        const unsigned long long* tab = stage_table(w_ptrs, held, tab_on & 1, tab_s);          \
        uint4 a[4], b[4];                                                                      \
        const bool pre = (tab_on & 2) && combine_first_load<RG>(a, b, w_ptrs, first, held, ids, \
                                                                t_count * k, n, rows,          \
                                                                e_routed, fs);                 \
        MLA_PDL();                                                                             \
        if (tab != w_ptrs) __syncthreads();                                                    \
        gemv_combine_body<RG>(tab, first, held, ids, act, wts, t_count, k, n, rows, e_routed,  \
                              fs, x, a, b, pre);                                               \
    }
MOE_GEMV_COMBINE(moe_gemv_combine, 4)
MOE_GEMV_COMBINE(moe_gemv_combine_r8, 8)

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
