// MoE on the GPU for small batches: routing (DeepSeek/GLM rules, the CPU's `route`) and
// expert GEMVs over (token, slot) pairs, so a decode step needs no host round trip.

// Routing of one token per block (blockDim 256, E <= 1024): logits [T, E] f32 ->
// ids [T, K] (i32, best first) and weights [T, K] f32. gating 0 = softmax, 1 = sigmoid;
// bias (may be null) only selects; groups as in the CPU path; ties to the lower index.
extern "C" __global__ void moe_route(const float* logits, const float* bias, int e, int k,
                                     int gating, int n_group, int topk_group, int norm,
                                     float scale, int* ids, float* weights) {
    MLA_PDL();
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
            ids[blockIdx.x * k + r] = ii;
            weights[blockIdx.x * k + r] = sc[ii];
            ch[ii] = -INFINITY;
        }
        __syncthreads();
        wsum += sc[best_i];
    }
    if (threadIdx.x == 0) {
        float inv = norm ? 1.f / (wsum + 1e-20f) : 1.f;
        for (int r = 0; r < k; r++) weights[blockIdx.x * k + r] *= inv * scale;
    }
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
    int ex = ids[p] - first;
    float* o = out + (i64)p * rows + row;
    if (ex < 0 || ex >= held || w_ptrs[ex] == 0ull) {
        if (lane == 0) *o = 0.f;
        return;
    }
    const bf16* w = (const bf16*)w_ptrs[ex] + (i64)row * n;
    const bf16* xv = x + (i64)(p / x_div) * n;
    float acc = 0.f;
    for (int i = lane * 8; i < n; i += 32 * 8) {
        uint4 a = *(const uint4*)(w + i);
        uint4 b = *(const uint4*)(xv + i);
        const bf16* aa = (const bf16*)&a;
        const bf16* bb = (const bf16*)&b;
#pragma unroll
        for (int j = 0; j < 8; j++) acc += bf2f(aa[j]) * bf2f(bb[j]);
    }
    acc = warp_sum(acc);
    if (lane == 0) *o = acc;
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
