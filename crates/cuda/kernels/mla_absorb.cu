// The absorbed MLA path's per-head projections for small decode steps, each fused with the
// small kernel next to it (a step of one token is latency-bound: every launch it saves is
// ~3 µs of a ~120 µs layer):
//   mla_q_absorb    RoPE of q_pe in place + q_lat = W_UK_T[h] . bf16(q_nope)  (q_finish/rope,
//                   the bf16 cast and the strided-batched W_UK GEMM in one launch);
//   mla_combine_uv  the LSE combine of the split decode's partials + W_UV[h] . o_lat
//                   (attn_mqa_combine and the strided-batched W_UV GEMM in one launch).
// Numerics: q_nope and o_lat rounded to bf16 exactly as the kernels they replace round them
// (bit-identical inputs to the products); products in f32 over bf16 weights, summed in
// another order than cuBLAS (the op table checks both against f64).

// q [T, N * qk] f32 (head h: q_nope at h*qk, q_pe at h*qk + p); w_uk_t [N, L, P] bf16;
// q_lat [T, N, L] f32. With cos non-null the blocks of chunk 0 also rotate q_pe in place
// (interleaved pairs, cos/sin [T, r/2], as rope_interleaved; no other block reads q_pe).
// With t_kv = T (and cos), blocks x < T are kv_finish's (kv_finish_row for token x by the
// block of chunk 0; its arguments kv, ks, kv_w, eps, slots, cache, and l and r as here) and
// the heads' blocks come after them: the latent row finished in the same launch, one
// dependent launch less on a small step's critical path. t_kv = 0: no such blocks.
// grid (t_kv + T * N, ceil(L / 64)), block 256: warp w takes rows 8w..8w+7 of the block's 64,
// half a warp a row (8 values a lane), the four rows of each half warp's loads in flight
// together. P % 8 == 0, P <= 512.
extern "C" __global__ void mla_q_absorb(float* q, const bf16* w_uk_t, float* q_lat, int n_heads,
                                        int qk, int p, int r, int l, const float* cos_t,
                                        const float* sin_t, float* kv, int ks, const float* kv_w,
                                        float eps, const i64* slots, bf16* cache, int t_kv) {
    MLA_WEIGHTS_FIRST();
    if ((int)blockIdx.x < t_kv) {
        MLA_PDL();
        if (blockIdx.y == 0)
            kv_finish_row(blockIdx.x, kv, ks, kv_w, l, r, eps, cos_t, sin_t, slots, cache);
        return;
    }
    const int th = blockIdx.x - t_kv, t = th / n_heads, h = th % n_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = lane >> 4, hl = lane & 15;
    const bf16* wh = w_uk_t + (i64)h * l * p;
    const int rb = blockIdx.y * 64 + warp * 8 + half;  // rows rb, rb + 2, rb + 4, rb + 6
    // The first 128 columns of the warp's rows, requested before the wait on the previous
    // grid (weights are never written by a kernel).
    uint4 a0[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (rb + 2 * i < l && hl * 8 < p) a0[i] = *(const uint4*)(wh + (i64)(rb + 2 * i) * p + hl * 8);
    MLA_PDL();
    float* qh = q + (i64)t * n_heads * qk + (i64)h * qk;
    // The lane's q_nope values, bf16-rounded as f32_to_bf16 rounds them, for every 128-wide
    // step of P (at most 4 steps: P <= 512).
    float xq[4][8];
#pragma unroll
    for (int s = 0; s < 4; s++) {
        int c = s * 128 + hl * 8;
#pragma unroll
        for (int j = 0; j < 8; j++) xq[s][j] = c < p ? bf2f(f2bf(qh[c + j])) : 0.f;
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const int c = s * 128 + hl * 8;
        if (c >= p) break;
        uint4 a[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (s == 0) a[i] = a0[i];
            else if (rb + 2 * i < l) a[i] = *(const uint4*)(wh + (i64)(rb + 2 * i) * p + c);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (rb + 2 * i >= l) continue;
            const bf16* aa = (const bf16*)&a[i];
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i] += bf2f(aa[j]) * xq[s][j];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = acc[i];
        // Sum over the half warp (lanes 16 apart never mix).
        for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (hl == 0 && rb + 2 * i < l) q_lat[((i64)t * n_heads + h) * l + rb + 2 * i] = v;
    }
    if (cos_t && blockIdx.y == 0) {
        const int hr = r / 2;
        const float* c = cos_t + (i64)t * hr;
        const float* s = sin_t + (i64)t * hr;
        for (int i = threadIdx.x; i < hr; i += blockDim.x) {
            float* pp = qh + p + 2 * i;
            float x0 = pp[0], x1 = pp[1];
            pp[0] = x0 * c[i] - x1 * s[i];
            pp[1] = x0 * s[i] + x1 * c[i];
        }
    }
}

#define MQA_COMBINE_MAX_SPLITS 256

// mla_combine_uv's LSE combine of one head (attn_mqa_combine's expressions in its order):
// lse ls [ns], partials pt [ns][l] -> ol [l] bf16 in shared memory. Each split's factor
// exp(lse - max) is computed once into shared memory (0 marks an empty split), the partials 8
// splits at a time. Every thread of the block calls it; ol is complete after a barrier.
__device__ void mla_combine_splits(const float* ls, const float* pt, int ns, int l, bf16* ol) {
    __shared__ float fac[MQA_COMBINE_MAX_SPLITS];
    __shared__ float inv_s;
    if (threadIdx.x < 32) {
        float mx = -INFINITY;
        for (int s = 0; s < ns; s++) mx = fmaxf(mx, ls[s]);
        for (int s = threadIdx.x; s < ns; s += 32)
            fac[s] = ls[s] == -INFINITY ? 0.f : __expf(ls[s] - mx);
        __syncwarp();
        if (threadIdx.x == 0) {
            float den = 0.f;
            for (int s = 0; s < ns; s++) den += fac[s];
            inv_s = den > 0.f ? 1.f / den : 0.f;
        }
    }
    __syncthreads();
    const float inv = inv_s;
    for (int d = threadIdx.x; d < l; d += blockDim.x) {
        float x = 0.f;
        for (int s0 = 0; s0 < ns; s0 += 8) {
            float pv[8];
#pragma unroll
            for (int u = 0; u < 8; u++) pv[u] = s0 + u < ns ? pt[(i64)(s0 + u) * l + d] : 0.f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (s0 + u < ns && fac[s0 + u] != 0.f) x += fac[s0 + u] * pv[u];
        }
        ol[d] = f2bf(x * inv);
    }
}

// part [T, N, NS, L] f32 and lse [T, N, NS] of the split decode; w_uv [N, V, L] bf16.
// o_lat = bf16(LSE combine), as attn_mqa_combine computes it (same expressions and order);
// out[t, h*V + v] = W_UV[h][v, :] . o_lat: bf16 into out_b where non-null, else f32 into out_f
// (= beta * out_f + product; beta 0 writes without reading).
// grid (T * N, ceil(V / 16)), block 256: warp w's rows 2w, 2w + 1 of the block's 16 are loaded
// into registers before the PDL wait, the block combines its head's o_lat into shared
// memory (at most 16 splits and L <= 512: every load of it at once), then each warp its two
// dots (lanes striding L by 8).
// L % 8 == 0, L <= 1024, NS <= MQA_COMBINE_MAX_SPLITS.
extern "C" __global__ void mla_combine_uv(const float* part, const float* lse, const bf16* w_uv,
                                          int ns, int l, int n_heads, int v, bf16* out_b,
                                          float* out_f, float beta) {
    MLA_WEIGHTS_FIRST();
    __shared__ __align__(16) bf16 ol[1024];
    const int th = blockIdx.x, h = th % n_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // The warp's two W_UV rows (all of L <= 1024: four 256-wide steps), requested before the
    // wait on the previous grid (weights are never written by a kernel).
    const int ra = blockIdx.y * 16 + warp * 2;
    const int rc = min(ra, v - 1), rb = min(ra + 1, v - 1);  // an odd last row twice
    const bf16* wh = w_uv + (i64)h * v * l;
    const bf16* w0 = wh + (i64)rc * l;
    const bf16* w1 = wh + (i64)rb * l;
    uint4 a[4], b[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane * 8 + u * 256;
        if (c < l) {
            a[u] = *(const uint4*)(w0 + c);
            b[u] = *(const uint4*)(w1 + c);
        }
    }
    MLA_PDL();
    const float* ls = lse + (i64)th * ns;
    const float* pt = part + (i64)th * ns * l;
    if (ns <= 16 && l <= 2 * (int)blockDim.x) {
        // A small step's combine (up to 16 splits, L <= 512): every load issued at once — the
        // head's lse and the thread's two columns of every split's partial, one memory round
        // trip — then each thread computes the factors itself, with mla_combine_splits'
        // expressions in its order, so the same bits.
        float lv[16], pv[2][16];
#pragma unroll
        for (int s = 0; s < 16; s++) lv[s] = s < ns ? ls[s] : -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int d = threadIdx.x + j * blockDim.x;
#pragma unroll
            for (int s = 0; s < 16; s++) pv[j][s] = s < ns && d < l ? pt[(i64)s * l + d] : 0.f;
        }
        float mx = -INFINITY;
#pragma unroll
        for (int s = 0; s < 16; s++)
            if (s < ns) mx = fmaxf(mx, lv[s]);
        float fs[16], den = 0.f;
#pragma unroll
        for (int s = 0; s < 16; s++) {
            fs[s] = s < ns && lv[s] != -INFINITY ? __expf(lv[s] - mx) : 0.f;
            if (s < ns) den += fs[s];
        }
        const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int d = threadIdx.x + j * blockDim.x;
            if (d >= l) break;
            float x = 0.f;
#pragma unroll
            for (int s = 0; s < 16; s++)
                if (s < ns && fs[s] != 0.f) x += fs[s] * pv[j][s];
            ol[d] = f2bf(x * inv);
        }
    } else {
        mla_combine_splits(ls, pt, ns, l, ol);
    }
    __syncthreads();
    if (ra >= v) return;
    float s0 = 0.f, s1 = 0.f;
    dot2_steps4(a, b, ol, lane * 8, l, s0, s1);
    s0 = warp_sum(s0);
    s1 = warp_sum(s1);
    if (lane != 0) return;
    const int t = th / n_heads;
    const i64 o = (i64)t * n_heads * v + (i64)h * v;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (j == 1 && rb == ra) break;
        const int row = j ? rb : ra;
        const float val = j ? s1 : s0;
        if (out_b) {
            out_b[o + row] = f2bf(val);
        } else {
            float* po = out_f + o + row;
            *po = beta == 0.f ? val : beta * *po + val;
        }
    }
}
