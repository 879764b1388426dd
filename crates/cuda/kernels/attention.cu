// MLA attention: the unabsorbed (MHA) prefill kernel, the absorbed (MQA) split-context decode
// kernel with its LSE combine, and the DSA indexer scores.
//
// Key lists. Query token t attends to n_keys[t] key positions: 0..n_keys[t] when
// sel_off[t] < 0 (dense causal), else sel_pos[sel_off[t] .. sel_off[t] + n_keys[t]] (DSA top-k,
// ascending). The MHA kernel finds key position p at row kv_base[t] + p of the decompressed
// K/V of its sequence; the MQA and indexer kernels find it in the paged cache at slot
// block_tables[bt_off[t] + p / bs] * bs + p % bs.

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_CHUNK 64
#define MAX_ACC 8  // output dims per thread: up to 1024 wide

__device__ __forceinline__ int key_pos(int t, int j, const int* sel_off, const int* sel_pos) {
    int o = sel_off[t];
    return o < 0 ? j : sel_pos[o + j];
}

__device__ __forceinline__ i64 paged_slot(int p, const int* bt, int bs) {
    return (i64)bt[p / bs] * bs + p % bs;
}

// Online-softmax update of one chunk. s[0..cnt) holds scaled scores on entry, probabilities
// on exit; m and l are the running max and sum. Returns the rescale factor for acc.
__device__ float softmax_chunk(float* s, int cnt, float* m, float* l, float* red) {
    float cm = block_max(threadIdx.x < cnt ? s[threadIdx.x] : -INFINITY, red);
    float nm = fmaxf(*m, cm);
    float factor = (*m == -INFINITY) ? 0.f : __expf(*m - nm);
    float p = 0.f;
    if (threadIdx.x < cnt) {
        p = __expf(s[threadIdx.x] - nm);
        s[threadIdx.x] = p;
    }
    float ps = block_sum(p, red);
    *l = *l * factor + ps;
    *m = nm;
    return factor;
}

// Unabsorbed attention. q [T, N*(P+R)] (per head [nope | rope]); k_nope [S, N*P];
// kpe [S, R]; v [S, N*V]; out [T, N*V].  grid (T, N), block ATT_THREADS.
extern "C" __global__ void attn_mha(const float* q, const float* k_nope, const float* kpe,
                                    const float* v, float* out, const int* n_keys,
                                    const int* sel_off, const int* sel_pos, const int* kv_base,
                                    int nh, int p_dim, int r_dim, int v_dim, float scale) {
    MLA_PDL();
    __shared__ float qs[1024];
    __shared__ float s[ATT_CHUNK];
    __shared__ int rows[ATT_CHUNK];
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, qk = p_dim + r_dim;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* qr = q + (i64)t * nh * qk + (i64)h * qk;
    for (int i = threadIdx.x; i < qk; i += ATT_THREADS) qs[i] = qr[i];
    float acc[MAX_ACC];
    for (int a = 0; a < MAX_ACC; a++) acc[a] = 0.f;
    float m = -INFINITY, l = 0.f;
    int nk = n_keys[t];
    for (int c0 = 0; c0 < nk; c0 += ATT_CHUNK) {
        int cnt = min(ATT_CHUNK, nk - c0);
        __syncthreads();
        for (int j = threadIdx.x; j < cnt; j += ATT_THREADS)
            rows[j] = kv_base[t] + key_pos(t, c0 + j, sel_off, sel_pos);
        __syncthreads();
        for (int j = warp; j < cnt; j += ATT_WARPS) {
            const float* kn = k_nope + (i64)rows[j] * nh * p_dim + (i64)h * p_dim;
            const float* kp = kpe + (i64)rows[j] * r_dim;
            float d = 0.f;
            for (int i = lane; i < p_dim; i += 32) d += qs[i] * kn[i];
            for (int i = lane; i < r_dim; i += 32) d += qs[p_dim + i] * kp[i];
            d = warp_sum(d);
            if (lane == 0) s[j] = d * scale;
        }
        __syncthreads();
        float factor = softmax_chunk(s, cnt, &m, &l, red);
        for (int a = 0; a < MAX_ACC; a++) {
            int dd = threadIdx.x + a * ATT_THREADS;
            if (dd >= v_dim) break;
            float x = acc[a] * factor;
            for (int j = 0; j < cnt; j++) x += s[j] * v[(i64)rows[j] * nh * v_dim + (i64)h * v_dim + dd];
            acc[a] = x;
        }
    }
    float inv = l > 0.f ? 1.f / l : 0.f;
    float* o = out + (i64)t * nh * v_dim + (i64)h * v_dim;
    for (int a = 0; a < MAX_ACC; a++) {
        int dd = threadIdx.x + a * ATT_THREADS;
        if (dd >= v_dim) break;
        o[dd] = acc[a] * inv;
    }
}

// Absorbed attention over the paged latent cache, one split of the key list per block.
// q_lat [T, N, L]; q [T, N*(P+R)] (its rope part); cache rows [L | R] bf16.
// part [T, N, NS, L] (normalized per split), lse [T, N, NS].  grid (T, N, NS), block ATT_THREADS.
extern "C" __global__ void attn_mqa_split(const float* q_lat, const float* q, const bf16* cache,
                                          float* part, float* lse, const int* n_keys,
                                          const int* sel_off, const int* sel_pos,
                                          const int* block_tables, const int* bt_off, int bs,
                                          int nh, int p_dim, int r_dim, int l_dim, float scale) {
    MLA_PDL();
    __shared__ float qs[1024 + 128];
    __shared__ float s[ATT_CHUNK];
    __shared__ i64 slots[ATT_CHUNK];
    __shared__ float red[32];
    int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, ns = gridDim.z;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, w = l_dim + r_dim;
    const float* ql = q_lat + ((i64)t * nh + h) * l_dim;
    const float* qp = q + (i64)t * nh * (p_dim + r_dim) + (i64)h * (p_dim + r_dim) + p_dim;
    for (int i = threadIdx.x; i < l_dim; i += ATT_THREADS) qs[i] = ql[i];
    for (int i = threadIdx.x; i < r_dim; i += ATT_THREADS) qs[l_dim + i] = qp[i];
    int nk = n_keys[t];
    int per = (nk + ns - 1) / ns;
    int k0 = sp * per, k1 = min(nk, k0 + per);
    const int* bt = block_tables + bt_off[t];
    float acc[MAX_ACC];
    for (int a = 0; a < MAX_ACC; a++) acc[a] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int c0 = k0; c0 < k1; c0 += ATT_CHUNK) {
        int cnt = min(ATT_CHUNK, k1 - c0);
        __syncthreads();
        for (int j = threadIdx.x; j < cnt; j += ATT_THREADS)
            slots[j] = paged_slot(key_pos(t, c0 + j, sel_off, sel_pos), bt, bs);
        __syncthreads();
        for (int j = warp; j < cnt; j += ATT_WARPS) {
            const bf16* row = cache + slots[j] * w;
            float d = 0.f;
            for (int i = lane; i < w; i += 32) d += qs[i] * bf2f(row[i]);
            d = warp_sum(d);
            if (lane == 0) s[j] = d * scale;
        }
        __syncthreads();
        float factor = softmax_chunk(s, cnt, &m, &l, red);
        for (int a = 0; a < MAX_ACC; a++) {
            int dd = threadIdx.x + a * ATT_THREADS;
            if (dd >= l_dim) break;
            float x = acc[a] * factor;
            for (int j = 0; j < cnt; j++) x += s[j] * bf2f(cache[slots[j] * w + dd]);
            acc[a] = x;
        }
    }
    i64 base = (((i64)t * nh + h) * ns + sp);
    float inv = l > 0.f ? 1.f / l : 0.f;
    for (int a = 0; a < MAX_ACC; a++) {
        int dd = threadIdx.x + a * ATT_THREADS;
        if (dd >= l_dim) break;
        part[base * l_dim + dd] = acc[a] * inv;
    }
    if (threadIdx.x == 0) lse[base] = l > 0.f ? m + __logf(l) : -INFINITY;
}

// LSE combine of the splits: o_lat[t, h, :] = bf16(sum_s e^(lse_s - M) part_s / sum_s e^(lse_s - M)).
// grid (T * N), block 256.
extern "C" __global__ void attn_mqa_combine(const float* part, const float* lse, bf16* o_lat,
                                            int ns, int l_dim) {
    MLA_PDL();
    i64 th = blockIdx.x;
    const float* ls = lse + th * ns;
    float mx = -INFINITY;
    for (int s = 0; s < ns; s++) mx = fmaxf(mx, ls[s]);
    float den = 0.f;
    for (int s = 0; s < ns; s++) den += (ls[s] == -INFINITY) ? 0.f : __expf(ls[s] - mx);
    float inv = den > 0.f ? 1.f / den : 0.f;
    for (int d = threadIdx.x; d < l_dim; d += blockDim.x) {
        float x = 0.f;
        for (int s = 0; s < ns; s++)
            if (ls[s] != -INFINITY) x += __expf(ls[s] - mx) * part[(th * ns + s) * l_dim + d];
        o_lat[th * l_dim + d] = f2bf(x * inv);
    }
}

// DSA lightning-indexer scores:
// score[t, j] = sum_h wt[t, h] * w_scale * relu(iq[t, h] . k_j * d_scale)
// for key positions j < n_keys[t] (dense); k_j from the f32 index-key cache.
// scores [T, max_keys].  grid (T, ceil(max_keys / ATT_WARPS)), block ATT_THREADS: a warp per key.
extern "C" __global__ void dsa_scores(const float* iq, const float* wt, const float* kcache,
                                      float* scores, const int* n_keys, const int* block_tables,
                                      const int* bt_off, int bs, int hi, int d, float d_scale,
                                      float w_scale, int max_keys) {
    MLA_PDL();
    int t = blockIdx.x, lane = threadIdx.x & 31;
    int j = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
    if (j >= n_keys[t]) return;
    const float* k = kcache + paged_slot(j, block_tables + bt_off[t], bs) * d;
    float total = 0.f;
    for (int h = 0; h < hi; h++) {
        const float* qh = iq + ((i64)t * hi + h) * d;
        float x = 0.f;
        for (int i = lane; i < d; i += 32) x += qh[i] * k[i];
        x = warp_sum(x);
        total += wt[(i64)t * hi + h] * w_scale * fmaxf(x * d_scale, 0.f);
    }
    if (lane == 0) scores[(i64)t * max_keys + j] = total;
}
