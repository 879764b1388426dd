// The absorbed MLA attention of a small decode step (one token a sequence) in one launch, over
// a thread-block cluster a (token, head) — mla_q_absorb (with kv_finish), the split decode and
// mla_combine_uv, three dependent launches on a one-token step's critical path, as one:
//
//   q_lat = W_UK_T[h] . bf16(q_nope)        block r of the cluster computes latent columns
//                                           [64r, 64r + 64), and after a cluster barrier
//                                           every block reads the others' (distributed shared
//                                           memory);
//   scores, softmax, O_r = sum_j p_j c_j    block r over its eighth of the token's key list
//                                           (cache rows copied into shared memory 80 at a
//                                           time, the first 80 but the token's own row
//                                           before the PDL wait);
//   o_lat = LSE merge of the 8 partials     block r merges latent columns [64r, 64r + 64)
//                                           reading the other blocks' partials remotely;
//   out = W_UV[h] . bf16(o_lat)             block r's 64 columns of every output row, and
//                                           after a cluster barrier the block that owns a
//                                           row (V / 8 rows a block) reads its 8 partials
//                                           and sums them in block order.
//
// The token's new latent row (kv [t] f32, not yet normalized or rotated) is finished here with
// kv_finish_row's expressions (so the same bits) by block 0 of head 0's cluster, which writes it
// to the cache, and by whichever block's key range holds its slot (into shared memory): no
// kernel reads the row before this one, and no block reads it from the cache.
// The weights' slices (W_UK_T 64 rows x P, W_UV V rows x 64: 32 KB at V2-Lite's P = V = 128)
// go into registers before the wait.
//
// Numerics: q_nope rounded to bf16 as mla_q_absorb rounds it; q_lat and the rotated q_pe in
// f32 (the tensor-core decode rounds them to bf16); scores, softmax and sums in f32 over the
// bf16 cache; o_lat rounded to bf16 as mla_combine_uv rounds it; out f32 (bf16 into out_b).
//
// Shapes: q [T, N * (P + 64)] f32 (q_pe unrotated), cos/sin [T, 32], kv [T, ks] f32 with the
// row [512 | 64], kv_w [512], slots [T] i64, cache [slots, 576] bf16, w_uk_t [N, 512, P] and
// w_uv [N, V, 512] bf16; key lists as attn_mqa (n_keys, sel_off, sel_pos; the token's own
// position among its keys or not, no other token's new row among them); out [T, N * V].
// grid (T * N * 8), cluster (8, 1, 1), block 256, dynamic shared memory sizeof(MacSmem).
// P % 8 == 0, P <= 256, V % 32 == 0, V <= 256. sm_90 (clusters); traps elsewhere.

#define MAC_CL 8    // blocks a cluster
#define MAC_L 512   // kv_lora_rank
#define MAC_R 64    // qk_rope_head_dim
#define MAC_W 576   // cache row (bf16)
#define MAC_LS 64   // latent columns a block owns: MAC_L / MAC_CL
#define MAC_KC 80   // keys a chunk in shared memory (V2-Lite's 513 keys: 65 a block, one chunk)
#define MAC_MAX_VB 32  // output rows a block owns at most: 256 / MAC_CL
#define MAC_THREADS 256
#define MAC_WARPS 8

struct MacSmem {
    bf16 keys[MAC_KC][MAC_W];         // the chunk's cache rows
    bf16 newrow[MAC_W];               // the token's finished row (blocks that use it)
    float q_lat[MAC_L];               // own slice computed, the others' read remotely
    float o_part[MAC_L];              // this block's unnormalized O, read by every block
    float outp[MAC_CL * MAC_MAX_VB];  // this block's partial of every output row, read by its owner
    alignas(8) float ml[2];           // this block's running max and sum, read remotely (v2)
    int newj;                         // index of the new row in the chunk, or -1
    int pad;
    float qn[256];                    // bf16(q_nope) as f32
    float qpe[MAC_R];                 // q_pe rotated
    float s[MAC_KC];                  // scores
    float p[MAC_KC];                  // probabilities
    i64 slot[MAC_KC];                 // the chunk's cache slots
    float ol[MAC_LS];                 // bf16(o_lat) of this block's columns, as f32
    float red[32];
};
// mla_cluster.rs's SMEM: a launch with less traps (a sticky context error), so keep the two equal.
static_assert(sizeof(MacSmem) == 101392, "mla_cluster.rs SMEM must be sizeof(MacSmem)");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Two consecutive floats (8-byte aligned) of a block of the cluster.
__device__ __forceinline__ float2 mac_ld2(unsigned addr) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void mac_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}

// Slots of keys [kc, kc + n) of the block's list into S.slot, then the copies of their cache
// rows into S.keys (cp.async, one group), all but the row at new_slot, whose index goes to
// S.newj (-1 if absent). Every thread calls it.
__device__ void mac_load_chunk(MacSmem& S, int kc, int n, int so, const int* sel_pos,
                               const int* bt, int bs, const bf16* cache, i64 new_slot) {
    if (threadIdx.x == 0) S.newj = -1;
    __syncthreads();
    if ((int)threadIdx.x < n) {
        const int kk = kc + threadIdx.x;
        const int pos = so < 0 ? kk : sel_pos[so + kk];
        const i64 sl = (i64)bt[pos / bs] * bs + pos % bs;
        S.slot[threadIdx.x] = sl;
        if (sl == new_slot) S.newj = threadIdx.x;
    }
    __syncthreads();
    // A warp a row: its slot read once, 72 16-byte pieces over the lanes.
    const int lane = threadIdx.x & 31;
    for (int j = threadIdx.x >> 5; j < n; j += MAC_WARPS) {
        const i64 sl = S.slot[j];
        if (sl == new_slot) continue;
        const bf16* src = cache + sl * MAC_W;
        for (int c = lane * 8; c < MAC_W; c += 32 * 8) mla_cp16(mla_smem(&S.keys[j][c]), src + c, 16);
    }
    mla_commit();
}

#endif

extern "C" __global__ void __launch_bounds__(256, 2) mla_attn_cl(
    const float* q, const float* cos_t, const float* sin_t, const float* kv, int ks,
    const float* kv_w, float eps, const i64* slots, bf16* cache, const bf16* w_uk_t,
    const bf16* w_uv, int n_heads, int p, int v, const int* n_keys, const int* sel_off,
    const int* sel_pos, const int* block_tables, const int* bt_off, int bs, float scale,
    bf16* out_b, float* out_f, float beta) {
    MLA_WEIGHTS_FIRST();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char mac_raw[];
    MacSmem& S = *(MacSmem*)mac_raw;
    MLA_TRACE_G0();
    MLA_T(0);
    unsigned rank, dyn;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < sizeof(MacSmem) || blockDim.x != MAC_THREADS) __trap();
    // Arrive now, wait before the q_lat exchange: every block of the cluster has started.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int th = blockIdx.x / MAC_CL, t = th / n_heads, h = th % n_heads;

    // Weights first (never written by a kernel). W_UK_T rows c = 64 rank + 8 warp + half + 2i
    // (i < 4), a half warp a row, columns 128 s + 8 hl .. + 8 (s < 2: P <= 256).
    const int half = lane >> 4, hl = lane & 15;
    const bf16* wk = w_uk_t + ((i64)h * MAC_L + rank * MAC_LS + warp * 8 + half) * p;
    uint4 ka[2][4];
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (s * 128 + hl * 8 < p) ka[s][i] = *(const uint4*)(wk + (i64)(2 * i) * p + s * 128 + hl * 8);
    // W_UV rows vr = warp * V/8 + lane/8 + 4i (i < V/32), this block's 64 columns, 8 lanes a
    // row (a uint4 each); block b owns rows [b V/8, (b + 1) V/8), the rows of warp b.
    const int vpw = v / MAC_WARPS, vpb = v / MAC_CL, u8 = lane & 7;
    uint4 va[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (4 * i < vpw)
            va[i] = *(const uint4*)(w_uv + ((i64)h * v + warp * vpw + (lane >> 3) + 4 * i) * MAC_L +
                                    rank * MAC_LS + u8 * 8);

    // The block's keys [k0, k1) and its first chunk: step inputs and rows cached before the
    // kernel just before this one began, but the token's own row (new_slot).
    const int nk = n_keys[t];
    const int per = (nk + MAC_CL - 1) / MAC_CL;
    const int k0 = min(nk, (int)rank * per), k1 = min(nk, k0 + per);
    const int so = sel_off[t];
    const int* bt = block_tables + bt_off[t];
    const i64 new_slot = slots[t];
    if (k1 > k0) mac_load_chunk(S, k0, min(MAC_KC, k1 - k0), so, sel_pos, bt, bs, cache, new_slot);
    // Whether this block needs the finished new row: its slot among the block's keys (the
    // list's slots are step inputs), or the cache write. Its norm weight and the token's
    // cos/sin (step inputs) are read now.
    const bool writer = h == 0 && rank == 0;
    bool mine = false;
    for (int kk = k0 + tid; kk < k1; kk += blockDim.x) {
        const int pos = so < 0 ? kk : sel_pos[so + kk];
        mine |= (i64)bt[pos / bs] * bs + pos % bs == new_slot;
    }
    const bool has_new = __syncthreads_or(mine) || writer;
    float gw = 0.f, gw2 = 0.f, cr = 0.f, sr = 0.f;
    if (has_new) {
        gw = kv_w[tid];
        gw2 = kv_w[tid + MAC_THREADS];
        if (tid < MAC_R / 2) {
            cr = cos_t[(i64)t * (MAC_R / 2) + tid];
            sr = sin_t[(i64)t * (MAC_R / 2) + tid];
        }
    }

    MLA_T(1);
    MLA_PDL();
    MLA_T(2);

    // One round trip: q_nope (bf16-rounded) and q_pe (rotated) of head h, and the new row's
    // values where needed.
    const float* qh = q + (i64)t * n_heads * (p + MAC_R) + (i64)h * (p + MAC_R);
    const float* row = kv + (i64)t * ks;
    float xe = 0.f, xb = 0.f, x0 = 0.f, x1 = 0.f;
    if (has_new) {
        xe = row[tid];
        xb = row[tid + MAC_THREADS];
        if (tid < MAC_R / 2) {
            x0 = row[MAC_L + 2 * tid];
            x1 = row[MAC_L + 2 * tid + 1];
        }
    }
    if (tid < p) S.qn[tid] = bf2f(f2bf(qh[tid]));
    if (tid < MAC_R / 2) {
        const int i = tid;
        const float y0 = qh[p + 2 * i], y1 = qh[p + 2 * i + 1];
        const float c = cos_t[(i64)t * (MAC_R / 2) + i], sn = sin_t[(i64)t * (MAC_R / 2) + i];
        S.qpe[2 * i] = y0 * c - y1 * sn;
        S.qpe[2 * i + 1] = y0 * sn + y1 * c;
    }
    if (has_new) {
        // kv_finish_row's arithmetic on its 256 threads (thread i: elements i, i + 256), so
        // the same bits.
        float ss = 0.f;
        ss += xe * xe;
        ss += xb * xb;
        ss = block_sum(ss, S.red);
        const int l = MAC_L;
        const float inv = rsqrtf(ss / l + eps);
        const bf16 b = f2bf(xe * inv * gw), b2 = f2bf(xb * inv * gw2);
        S.newrow[tid] = b;
        S.newrow[tid + MAC_THREADS] = b2;
        if (writer) {
            cache[new_slot * MAC_W + tid] = b;
            cache[new_slot * MAC_W + tid + MAC_THREADS] = b2;
        }
        if (tid < MAC_R / 2) {
            const float y0 = x0 * cr - x1 * sr, y1 = x0 * sr + x1 * cr;
            S.newrow[MAC_L + 2 * tid] = f2bf(y0);
            S.newrow[MAC_L + 2 * tid + 1] = f2bf(y1);
            if (writer) {
                cache[new_slot * MAC_W + MAC_L + 2 * tid] = f2bf(y0);
                cache[new_slot * MAC_W + MAC_L + 2 * tid + 1] = f2bf(y1);
            }
        }
    }
    __syncthreads();
    MLA_T(3);

    // q_lat columns [64 rank, 64 rank + 64) into this block's S.q_lat.
    {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int c = s * 128 + hl * 8;
            if (c >= p) break;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const bf16* aa = (const bf16*)&ka[s][i];
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i] += bf2f(aa[j]) * S.qn[c + j];
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float x = acc[i];
            for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
            if (hl == 0) S.q_lat[rank * MAC_LS + warp * 8 + half + 2 * i] = x;
        }
        asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
        MLA_T(4);
    }
    // Published by a barrier after local stores (a release over remote stores costs ~3x),
    // then pulled.
    mac_cluster_sync();
    // The lane's query features: latent words 2 lane + 64 u + e (u < 4, e < 2; word w holds
    // features 2w, 2w + 1) and rope word 256 + lane (features 2 lane, 2 lane + 1 of q_pe).
    float2 qa[4][2];
    // Thread tid's pair 2 tid, 2 tid + 1 from the block owning it, into the local copy.
    {
        const int f = 2 * tid, b = f / MAC_LS;
        if (b != (int)rank) {
            const unsigned a = cl_remote(&S.q_lat[f], b);
            const float x0 = cl_ld_f32(a), x1 = cl_ld_f32(a + 4);
            S.q_lat[f] = x0;
            S.q_lat[f + 1] = x1;
        }
    }
    __syncthreads();
    MLA_T(5);
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int f = 2 * (2 * lane + 64 * u + e);
            qa[u][e] = make_float2(S.q_lat[f], S.q_lat[f + 1]);
        }
    const float2 qb = make_float2(S.qpe[2 * lane], S.qpe[2 * lane + 1]);
    // O: thread tid's latent columns 2 tid, 2 tid + 1.
    float m_run = -INFINITY, l_run = 0.f, o0 = 0.f, o1 = 0.f;
    for (int kc = k0; kc < k1; kc += MAC_KC) {
        const int n = min(MAC_KC, k1 - kc);
        if (kc != k0) {
            __syncthreads();  // the previous chunk fully used
            mac_load_chunk(S, kc, n, so, sel_pos, bt, bs, cache, new_slot);
        }
        mla_wait<0>();
        __syncthreads();
        if (S.newj >= 0)
            for (int i = tid; i < MAC_W / 8; i += blockDim.x)
                *(uint4*)&S.keys[S.newj][i * 8] = *(const uint4*)&S.newrow[i * 8];
        __syncthreads();
        MLA_T(6);
        // Scores: warp w keys w, w + 8, w + 16, w + 24, then 32 further on.
        // A key's 288 words: four 8-byte loads and one 4-byte load a lane, the low and high
        // halves into two accumulators; keys past n read row n - 1 (a row in the chunk) and
        // are not written. The four keys' sums reduced together: halves of the values
        // exchanged over lanes 16 and 8 apart, then one value over 4, 2, 1; lane 8g ends with
        // key g's sum.
        for (int j0 = warp; j0 < n; j0 += 4 * MAC_WARPS) {
            float d[4];
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const int j = min(j0 + MAC_WARPS * g, n - 1);
                const uint2* kr = (const uint2*)S.keys[j];
                float a = 0.f, b = 0.f;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint2 k = kr[lane + 32 * u];
                    a = fmaf(qa[u][0].x, __uint_as_float(k.x << 16), a);
                    b = fmaf(qa[u][0].y, __uint_as_float(k.x & 0xffff0000u), b);
                    a = fmaf(qa[u][1].x, __uint_as_float(k.y << 16), a);
                    b = fmaf(qa[u][1].y, __uint_as_float(k.y & 0xffff0000u), b);
                }
                const unsigned k = ((const unsigned*)S.keys[j])[256 + lane];
                a = fmaf(qb.x, __uint_as_float(k << 16), a);
                b = fmaf(qb.y, __uint_as_float(k & 0xffff0000u), b);
                d[g] = a + b;
            }
            const bool ua = lane & 16, ub = lane & 8;
            float e0 = ua ? d[2] : d[0], e1 = ua ? d[3] : d[1];  // keys 2ua, 2ua + 1
            e0 += __shfl_xor_sync(0xffffffffu, ua ? d[0] : d[2], 16);
            e1 += __shfl_xor_sync(0xffffffffu, ua ? d[1] : d[3], 16);
            float x = ub ? e1 : e0;  // key 2ua + ub
            x += __shfl_xor_sync(0xffffffffu, ub ? e0 : e1, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 4);
            x += __shfl_xor_sync(0xffffffffu, x, 2);
            x += __shfl_xor_sync(0xffffffffu, x, 1);
            const int j = j0 + MAC_WARPS * (lane >> 3);
            if ((lane & 7) == 0 && j < n) S.s[j] = x * scale;
        }
        __syncthreads();
        MLA_T(7);
        const float sv = tid < n ? S.s[tid] : -INFINITY;
        // block_max's and block_sum's values with one block barrier instead of their six:
        // every warp takes the max over all n scores, and the sum of the 8 warps' sums in
        // block_sum's order (its warp 0's lanes) after the barrier that publishes S.p.
        float mx = -INFINITY;
        for (int j = lane; j < n; j += 32) mx = fmaxf(mx, S.s[j]);
        const float m_new = fmaxf(m_run, warp_max(mx));
        const float fac = m_run == -INFINITY ? 0.f : __expf(m_run - m_new);
        const float pv = tid < n ? __expf(sv - m_new) : 0.f;
        if (tid < n) S.p[tid] = pv;
        const float ws = warp_sum(pv);
        if (lane == 0) S.red[warp] = ws;
        __syncthreads();
        const float lsum = warp_sum(lane < MAC_WARPS ? S.red[lane] : 0.f);
        l_run = l_run * fac + lsum;
        o0 *= fac;
        o1 *= fac;
        m_run = m_new;
        MLA_T(8);
        const unsigned* col = (const unsigned*)&S.keys[0][0] + tid;
#pragma unroll 4
        for (int j = 0; j < n; j++) {
            const unsigned k2 = col[j * (MAC_W / 2)];
            const float pj = S.p[j];
            o0 += pj * __uint_as_float(k2 << 16);
            o1 += pj * __uint_as_float(k2 & 0xffff0000u);
        }
    }
    MLA_T(9);
    S.o_part[2 * tid] = o0;
    S.o_part[2 * tid + 1] = o1;
    if (tid == 0) {
        S.ml[0] = m_run;
        S.ml[1] = l_run;
    }
    mac_cluster_sync();
    MLA_T(10);

    // o_lat columns [64 rank, 64 rank + 64): the LSE merge of the 8 blocks' partials, four
    // lanes a column (every thread): lane q of four reads blocks q and q + 4 (4 remote loads a
    // thread, not 24 on 64 threads); the max, the weights' sum and the weighted sum over the
    // four lanes by shuffles. Session 22-23: -1.5 to -2.8 µs a step (bench/cuda/v2lite.md).
    {
        const int c = rank * MAC_LS + (tid >> 2), q4 = tid & 3;
        float mb[2], lb[2], ob[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int b = q4 + 4 * e;
            const float2 ml = mac_ld2(cl_remote(&S.ml[0], b));
            mb[e] = ml.x;
            lb[e] = ml.y;
            ob[e] = cl_ld_f32(cl_remote(&S.o_part[c], b));
        }
        float mx = -INFINITY;
#pragma unroll
        for (int e = 0; e < 2; e++)
            if (lb[e] > 0.f) mx = fmaxf(mx, mb[e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float den = 0.f, x = 0.f;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (!(lb[e] > 0.f)) continue;
            const float f = __expf(mb[e] - mx);
            den += f * lb[e];
            x += f * ob[e];
        }
        den += __shfl_xor_sync(0xffffffffu, den, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        den += __shfl_xor_sync(0xffffffffu, den, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        if (q4 == 0) S.ol[tid >> 2] = bf2f(f2bf(den > 0.f ? x * (1.f / den) : 0.f));
    }
    __syncthreads();
    MLA_T(11);

    // This block's 64 columns of every W_UV row.
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (4 * i >= vpw) break;
        const bf16* aa = (const bf16*)&va[i];
        float x = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) x += bf2f(aa[j]) * S.ol[u8 * 8 + j];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        // Stored locally, pulled by the row's owner after the barrier below (as q_lat: a
        // release over remote stores costs ~3x a plain barrier).
        if (u8 == 0) S.outp[warp * vpw + (lane >> 3) + 4 * i] = x;
    }
    mac_cluster_sync();
    MLA_T(12);
    // Row rank * vpb + tid: the 8 blocks' partials summed in block order.
    float x = 0.f;
    if (tid < vpb) {
        const int vr = rank * vpb + tid;
        float pb[MAC_CL];
#pragma unroll
        for (int b = 0; b < MAC_CL; b++)
            pb[b] = b == (int)rank ? S.outp[vr] : cl_ld_f32(cl_remote(&S.outp[vr], b));
#pragma unroll
        for (int b = 0; b < MAC_CL; b++) x += pb[b];
    }
    // The blocks read one another's S.outp above: arrive once this thread's reads are used
    // (the release has no store to wait for), and leave only when every block has.
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    if (tid < vpb) {
        const i64 o = (i64)t * n_heads * v + (i64)h * v + rank * vpb + tid;
        if (out_b) {
            out_b[o] = f2bf(x);
        } else {
            out_f[o] = beta == 0.f ? x : beta * out_f[o] + x;
        }
    }
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    MLA_T(13);
    MLA_TRACE_G1();
#else
    __trap();
#endif
}
