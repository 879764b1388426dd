// Embedding, dtype conversion, norms, RoPE, SwiGLU, row gathers and the MoE combine.

// x[t, :] = f32(table[tokens[t], :]).  grid (T), block 256.
extern "C" __global__ void embed_bf16(const bf16* table, const unsigned* tokens, float* x, int h) {
    MLA_PDL();
    const bf16* row = table + (i64)tokens[blockIdx.x] * h;
    float* out = x + (i64)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) out[i] = bf2f(row[i]);
}

// y = bf16(x), n elements.  grid-stride.
extern "C" __global__ void f32_to_bf16(const float* x, bf16* y, i64 n) {
    MLA_PDL();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        y[i] = f2bf(x[i]);
}

// RMSNorm of row r of x (n wide, row stride xs) times w; writes f32 (out, row stride os)
// and/or bf16 (outb, row stride obs) where the pointer is non-null.  grid (rows), block 256.
// `rows_idx` (may be null) picks the input row of each output row.
extern "C" __global__ void rms_norm(const float* x, int xs, const int* rows_idx, const float* w,
                                    float* out, int os, bf16* outb, int obs, int n, float eps) {
    MLA_PDL();
    __shared__ float red[32];
    int r = blockIdx.x;
    const float* xr = x + (i64)(rows_idx ? rows_idx[r] : r) * xs;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * inv * w[i];
        if (out) out[(i64)r * os + i] = v;
        if (outb) outb[(i64)r * obs + i] = f2bf(v);
    }
}

// LayerNorm (mean/variance, weight and bias) of each row in place.  grid (rows), block 128.
extern "C" __global__ void layer_norm(float* x, int xs, const float* w, const float* b, int n,
                                      float eps) {
    MLA_PDL();
    __shared__ float red[32];
    float* xr = x + (i64)blockIdx.x * xs;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    float mean = block_sum(s, red) / n;
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    float inv = rsqrtf(block_sum(v, red) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// Interleaved RoPE in place: for token t and head h, the r values at
// x + t*row_stride + h*head_stride + offset rotate in pairs (2i, 2i+1) by cos/sin[t, i]
// (tables [T, r/2], attention factor included).  grid (T), block 128.
extern "C" __global__ void rope_interleaved(float* x, int row_stride, int n_heads, int head_stride,
                                            int offset, int r, const float* cos_t,
                                            const float* sin_t) {
    MLA_PDL();
    int t = blockIdx.x, half = r / 2;
    const float* c = cos_t + (i64)t * half;
    const float* s = sin_t + (i64)t * half;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        float* p = x + (i64)t * row_stride + (i64)h * head_stride + offset + 2 * i;
        float x0 = p[0], x1 = p[1];
        p[0] = x0 * c[i] - x1 * s[i];
        p[1] = x0 * s[i] + x1 * c[i];
    }
}

// The query rows of the absorbed path finished in one kernel (rope_interleaved then
// f32_to_bf16, with their arithmetic, so bit-identical to them): q [T, width] f32 rotated in
// place (heads head_stride apart, pairs from offset, r wide, by cos/sin [T, r/2]), then
// qb [T, width] = bf16(q).  grid (T), block 256.
extern "C" __global__ void q_finish(float* q, int width, int n_heads, int head_stride,
                                    int offset, int r, const float* cos_t, const float* sin_t,
                                    bf16* qb) {
    MLA_PDL();
    int t = blockIdx.x, half = r / 2;
    const float* c = cos_t + (i64)t * half;
    const float* s = sin_t + (i64)t * half;
    float* row = q + (i64)t * width;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        float* p = row + (i64)h * head_stride + offset + 2 * i;
        float x0 = p[0], x1 = p[1];
        p[0] = x0 * c[i] - x1 * s[i];
        p[1] = x0 * s[i] + x1 * c[i];
    }
    __syncthreads();
    bf16* out = qb + (i64)t * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) out[i] = f2bf(row[i]);
}

// out[t, i] = bf16(silu(gu[t, i]) * gu[t, f + i]) for gate|up rows [T, 2f].  grid-stride.
extern "C" __global__ void silu_mul_bf16(const float* gu, bf16* out, int f, i64 rows) {
    MLA_PDL();
    i64 n = rows * f;
    for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
        i64 t = k / f;
        int i = (int)(k % f);
        float g = gu[t * 2 * f + i], u = gu[t * 2 * f + f + i];
        out[k] = f2bf(g / (1.f + __expf(-g)) * u);
    }
}

// dst[m, :] = src[idx[m], :] (bf16 rows of width n).  grid (M), block 256.
extern "C" __global__ void gather_rows_bf16(const bf16* src, const int* idx, bf16* dst, int n) {
    MLA_PDL();
    const bf16* s = src + (i64)idx[blockIdx.x] * n;
    bf16* d = dst + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// MoE combine, deterministic: x[t, :] += sum_k w[t, k] * y[rows[t, k], :] (rows < 0 skipped).
// grid (T), block 256.
extern "C" __global__ void moe_combine(float* x, const float* y, const int* rows, const float* w,
                                       int k, int h) {
    MLA_PDL();
    int t = blockIdx.x;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
            int r = rows[t * k + j];
            if (r >= 0) acc += w[t * k + j] * y[(i64)r * h + i];
        }
        x[(i64)t * h + i] += acc;
    }
}

// Latent-cache write: cache[slots[t], :] = bf16(kv[t, :]) (width w, kv row stride ks).
// grid (T), block 256.
extern "C" __global__ void cache_write_bf16(const float* kv, int ks, const i64* slots, bf16* cache,
                                            int w) {
    MLA_PDL();
    const float* s = kv + (i64)blockIdx.x * ks;
    bf16* d = cache + slots[blockIdx.x] * w;
    for (int i = threadIdx.x; i < w; i += blockDim.x) d[i] = f2bf(s[i]);
}

// The latent row of token t finished and cached (rms_norm, rope_interleaved and
// cache_write_bf16 in turn, with their arithmetic, so bit-identical to them): kv [T, l+r]
// f32 (row stride ks) in place — kv_c = kv[:, :l] RMSNorm'd times w, k_pe = kv[:, l:l+r]
// rotated in interleaved pairs by cos/sin [T, r/2] (r even) — then cache[slots[t], :] =
// bf16(row). Every thread of a block of 256 calls it.
__device__ void kv_finish_row(int t, float* kv, int ks, const float* w, int l, int r, float eps,
                              const float* cos_t, const float* sin_t, const i64* slots,
                              bf16* cache) {
    __shared__ float red[32];
    const int half = r / 2;
    float* row = kv + (i64)t * ks;
    float ss = 0.f;
    for (int i = threadIdx.x; i < l; i += blockDim.x) ss += row[i] * row[i];
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / l + eps);
    bf16* d = cache + slots[t] * (l + r);
    for (int i = threadIdx.x; i < l; i += blockDim.x) {
        const float v = row[i] * inv * w[i];
        row[i] = v;
        d[i] = f2bf(v);
    }
    const float* c = cos_t + (i64)t * half;
    const float* sn = sin_t + (i64)t * half;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float* p = row + l + 2 * i;
        const float x0 = p[0], x1 = p[1];
        const float y0 = x0 * c[i] - x1 * sn[i], y1 = x0 * sn[i] + x1 * c[i];
        p[0] = y0;
        p[1] = y1;
        d[l + 2 * i] = f2bf(y0);
        d[l + 2 * i + 1] = f2bf(y1);
    }
}

// kv_finish_row for every token. grid (T), block 256.
extern "C" __global__ void kv_finish(float* kv, int ks, const float* w, int l, int r, float eps,
                                     const float* cos_t, const float* sin_t, const i64* slots,
                                     bf16* cache) {
    MLA_PDL();
    kv_finish_row(blockIdx.x, kv, ks, w, l, r, eps, cos_t, sin_t, slots, cache);
}

// f32 variant (DSA index keys).
extern "C" __global__ void cache_write_f32(const float* kv, int ks, const i64* slots, float* cache,
                                           int w) {
    MLA_PDL();
    const float* s = kv + (i64)blockIdx.x * ks;
    float* d = cache + slots[blockIdx.x] * w;
    for (int i = threadIdx.x; i < w; i += blockDim.x) d[i] = s[i];
}

// Gather cache rows of slots[j] (row width w, bf16): columns [0, l) to kvc [S, l] as bf16 and
// [l, w) to kpe [S, w-l] as f32.  grid (S), block 256.
extern "C" __global__ void gather_latent(const bf16* cache, const i64* slots, int w, int l,
                                         bf16* kvc, float* kpe) {
    MLA_PDL();
    const bf16* row = cache + slots[blockIdx.x] * w;
    for (int i = threadIdx.x; i < w; i += blockDim.x) {
        if (i < l) kvc[(i64)blockIdx.x * l + i] = row[i];
        else kpe[(i64)blockIdx.x * (w - l) + (i - l)] = bf2f(row[i]);
    }
}

// x[i] += y[i], n elements (the residual add of an all-reduced partial).  grid-stride.
extern "C" __global__ void add_f32(float* x, const float* y, i64 n) {
    MLA_PDL();
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        x[i] += y[i];
}

// dst[m, :] = src[idx[m], :], f32 rows of n.  grid (M), block 256.
extern "C" __global__ void gather_rows_f32(const float* src, const int* idx, float* dst, int n) {
    MLA_PDL();
    const float* s = src + (i64)idx[blockIdx.x] * n;
    float* d = dst + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// dst[idx[m], :] += src[m, :] (idx distinct), f32 rows of n.  grid (M), block 256.
extern "C" __global__ void add_rows_indexed(float* dst, const float* src, const int* idx, int n) {
    MLA_PDL();
    float* d = dst + (i64)idx[blockIdx.x] * n;
    const float* s = src + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] += s[i];
}

// Each logits row reduced to its token (mlaserve_model::RowPick, whose `of` is the
// reference): out[r] = its RowArgmax {the lowest index of the row's largest value among those
// that are neither NaN nor +inf (0 if none is above -inf), that value's bits (-inf if none),
// the lowest index holding NaN or +inf (0xffffffff if none), its bits}; picked[r] = the token
// its draw chose: draws == 0 or draws[8r + 3] == 0 (greedy) the argmax, else one softmax
// draw by mlaserve_model::draw's integer weights with draws[8r..8r+8] = {1/temperature bits,
// the random u64's low word, its high word, 1, top_k (0: off), top_p bits (>= 1: off), min_p
// bits (<= 0: off), 0} (a row with NaN / +inf or nothing above -inf: the argmax). A row drawn
// with a filter is overwritten with its probabilities (pick_filtered). logits [rows, vocab]
// f32, 16-byte aligned where vocab % 4 == 0 (float4 loads). grid (rows), block 1024 (a
// multiple of 32).
__device__ __forceinline__ void argmax_take(float v, unsigned i, float& bv, unsigned& bi,
                                            unsigned& badi) {
    if (isnan(v) || v == INFINITY) {
        badi = min(badi, i);
    } else if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}
// The warp's (max, its lowest index, lowest unusable index) in every lane: the same rules
// as argmax_take across lanes.
__device__ __forceinline__ void argmax_warp(float& bv, unsigned& bi, unsigned& badi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const unsigned i = __shfl_xor_sync(0xffffffffu, bi, o);
        badi = min(badi, __shfl_xor_sync(0xffffffffu, badi, o));
        if (v > bv || (v == bv && i < bi)) {
            bv = v;
            bi = i;
        }
    }
}
// mlaserve_model::draw::softmax_prob, operation for operation (the _rn intrinsics are never
// contracted into FMAs): exp((l - mx) * inv_t) for l <= mx, 0 below e^-28.
__device__ __forceinline__ float softmax_prob(float l, float mx, float inv_t) {
    const float SHIFTER = 12582912.0f;  // 1.5 * 2^23
    const float x = __fmul_rn(__fsub_rn(l, mx), inv_t);
    if (!(x > -28.0f)) return 0.0f;
    const float t = __fmul_rn(x, 1.44269504088896340736f);
    const float r = __fadd_rn(t, SHIFTER);
    const float f = __fsub_rn(t, __fsub_rn(r, SHIFTER));
    float p = 1.5353362e-4f;
    p = __fadd_rn(__fmul_rn(p, f), 1.3398874e-3f);
    p = __fadd_rn(__fmul_rn(p, f), 9.618437e-3f);
    p = __fadd_rn(__fmul_rn(p, f), 5.5503325e-2f);
    p = __fadd_rn(__fmul_rn(p, f), 2.4022648e-1f);
    p = __fadd_rn(__fmul_rn(p, f), 6.931472e-1f);
    p = __fadd_rn(__fmul_rn(p, f), 1.0f);
    const int e = (int)__float_as_uint(r) - (int)__float_as_uint(SHIFTER);
    return __fmul_rn(p, __uint_as_float((unsigned)(127 + e) << 23));
}
// mlaserve_model::draw::weight: p * 2^40, truncated
__device__ __forceinline__ unsigned long long softmax_weight(float l, float mx, float inv_t) {
    return (unsigned long long)__fmul_rn(softmax_prob(l, mx, inv_t), 1099511627776.0f);
}
// The weights of the e (4 or 1) values from row[j]: one float4 load where e == 4 (j % 4 == 0).
__device__ __forceinline__ unsigned long long pick_weights(const float* row, int j, int e,
                                                         float mx, float inv_t) {
    if (e == 4) {
        const float4 q = *reinterpret_cast<const float4*>(row + j);
        return softmax_weight(q.x, mx, inv_t) + softmax_weight(q.y, mx, inv_t) +
               softmax_weight(q.z, mx, inv_t) + softmax_weight(q.w, mx, inv_t);
    }
    return softmax_weight(row[j], mx, inv_t);
}
// Inclusive sum over the warp's lanes 0..=lane.
__device__ __forceinline__ unsigned long long warp_incl_u64(unsigned long long v, int lane) {
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    return v;
}
// ---- drawing with top-k / top-p / min-p (mlaserve_model::draw::filtered), a block a row ----
// Calls g(i, row[i]) for this thread's share of i in [0, n) — float4 loads where n % 4 == 0
// (rows then 16-byte aligned) — in a loop whose trip count is the same in every thread
// (warp-converged: g may use warp intrinsics); v is false for the i >= n a trip pads with.
template <class G>
__device__ __forceinline__ void row_trips(const float* row, int n, G g) {
    if ((n & 3) == 0) {
        for (int base = 0; base < n; base += 4 * blockDim.x) {
            const int j = base + 4 * threadIdx.x;
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < n) q = *reinterpret_cast<const float4*>(row + j);
            g(j, q.x, j < n);
            g(j + 1, q.y, j < n);
            g(j + 2, q.z, j < n);
            g(j + 3, q.w, j < n);
        }
    } else {
        for (int base = 0; base < n; base += blockDim.x) {
            const int i = base + threadIdx.x;
            g(i, i < n ? row[i] : 0.0f, i < n);
        }
    }
}
// Sum of f(i, row[i]) over i in [0, n), in every thread. red: 32 words of shared memory.
template <class F>
__device__ unsigned long long block_sum_u64(const float* row, int n, F f,
                                            unsigned long long* red) {
    unsigned long long s = 0;
    row_trips(row, n, [&](int i, float p, bool v) {
        if (v) s += f(i, p);
    });
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __syncthreads();  // red's last readers are done
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    unsigned long long t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += red[w];
    return t;
}
// The first i in [0, n) whose running sum of f over 0..=i exceeds thr (the whole sum must), in
// every thread: warp segments, then 32-value steps a lane each, then the lane.
template <class F>
__device__ int block_find(int n, F f, unsigned long long thr, unsigned long long* red, int* found) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int sg = (n + nw * 32 - 1) / (nw * 32) * 32;
    const int lo = min(n, warp * sg), hi = min(n, lo + sg);
    unsigned long long mine = 0;
    for (int j = lo + lane; j < hi; j += 32) mine += f(j);
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    __syncthreads();
    if (lane == 0) red[warp] = mine;
    __syncthreads();
    unsigned long long rem = thr;
    int w = 0;
    while (w < nw - 1 && red[w] <= rem) rem -= red[w++];
    if (warp == w) {
        for (int g = lo; g < hi; g += 32 * 32) {
            const int st = g + lane * 32;
            unsigned long long s = 0;
            for (int j = st; j < min(st + 32, hi); ++j) s += f(j);
            unsigned long long incl = warp_incl_u64(s, lane);
            const unsigned hit = __ballot_sync(0xffffffffu, incl > rem);
            if (!hit) {
                rem -= __shfl_sync(0xffffffffu, incl, 31);
                continue;
            }
            const int k = __ffs(hit) - 1;
            rem -= __shfl_sync(0xffffffffu, incl - s, k);
            const int j0 = g + k * 32 + lane;
            s = j0 < hi ? f(j0) : 0ull;
            incl = warp_incl_u64(s, lane);
            const unsigned at = __ballot_sync(0xffffffffu, incl > rem);
            if (lane == __ffs(at) - 1) *found = j0;
            break;
        }
    }
    __syncthreads();
    const int r = *found;
    __syncthreads();  // found's readers done before its next write
    return r;
}
// Scratch in shared memory for pick_filtered's radix selects.
struct RadixScratch {
    unsigned lo[1024], hi[1024];  // 64-bit sums as two words
    unsigned long long above;  // the selected bin's S above it
    unsigned prefix;           // the digits selected so far
};
// rs's bin += v, exactly, by 32-bit atomics with the carry counted once: sm_90 has no native
// 64-bit add in shared memory (a u64 atomicAdd there is a compare-and-swap spin; the two
// native adds timed the same at one row: bench/cuda/v2lite.md, session 31).
__device__ __forceinline__ void hist_add(RadixScratch* rs, unsigned bin, unsigned long long v) {
    const unsigned lo = (unsigned)v;
    const unsigned old = atomicAdd(&rs->lo[bin], lo);
    const unsigned hi = (unsigned)(v >> 32) + (old + lo < old ? 1u : 0u);
    if (hi) atomicAdd(&rs->hi[bin], hi);
}
__device__ __forceinline__ unsigned long long hist_bin(const RadixScratch* rs, int b) {
    return ((unsigned long long)rs->hi[b] << 32) | rs->lo[b];
}
// The largest key v (the bits of a probability: monotone for p >= 0, at most 0x3F800000 <
// 2^30) whose S(v) = sum of f(i, p) over the i with key >= v reaches target (S(0) must), by a
// radix select over the key's three 10-bit digits (bits 29-20, 19-10, 9-0): a pass over the
// row each, summing f into the bins of the keys that match the digits selected so far, then
// the highest bin where S, summed from the top, reaches target; above = S(v + 1). Sums are
// integers, so the bins' atomic adds in any order give bisection's v exactly.
template <class F>
__device__ unsigned radix_key(int n, const float* prob, F f, unsigned long long target,
                              unsigned long long& above, unsigned long long* red,
                              RadixScratch* rs) {
    const int nb = 1024, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int c = (nb + (int)blockDim.x - 1) / (int)blockDim.x;  // bins a thread, from the top
    unsigned prefix = 0;
    unsigned long long ab = 0;  // S over the keys whose selected digits exceed prefix
#ifdef PICK_LAB_NO_RADIX  // lab only (wrong picks): the draw's other passes alone
    above = 0;
    return 0;
#endif
    for (int shift = 20; shift >= 0; shift -= 10) {
        for (int b = t; b < nb; b += blockDim.x)
            rs->lo[b] = rs->hi[b] = 0;
        __syncthreads();
#ifdef PICK_LAB_NO_ATOMICS
        unsigned long long sink = 0;
#endif
        row_trips(prob, n, [&](int i, float p, bool v) {
            const unsigned key = __float_as_uint(p);
            unsigned bin = 0xffffffffu;  // none
            unsigned long long x = 0;
            if (v && (key >> (shift + 10)) == prefix) {
                x = f(i, p);
                if (x) bin = (key >> shift) & (nb - 1);
            }
#if defined(PICK_LAB_NO_ATOMICS)  // lab only (wrong picks): the pass without its atomics
            sink += x + bin;
#else
            // an atomic a lane: aggregating a warp's lanes by bin first (__match_any_sync,
            // __reduce_add_sync) cost ~4x the whole select (bench/cuda/v2lite.md, session 33)
            if (bin != 0xffffffffu) hist_add(rs, bin, x);
#endif
        });
#ifdef PICK_LAB_NO_ATOMICS
        if (sink == 1ull) rs->lo[0] = 1u;  // kept: the pass's loads and tests stay
#endif
        __syncthreads();
        unsigned long long local = 0;
        for (int j = 0; j < c; ++j) {
            const int b = nb - 1 - (t * c + j);
            if (b >= 0) local += hist_bin(rs, b);
        }
        const unsigned long long incl = warp_incl_u64(local, lane);
        if (lane == 31) red[warp] = incl;
        __syncthreads();
        unsigned long long run = ab + incl - local;  // S of the bins above this thread's
        for (int w = 0; w < warp; ++w) run += red[w];
        if (run < target && run + local >= target) {  // the one thread whose bins reach it
            for (int j = 0; j < c; ++j) {
                const int b = nb - 1 - (t * c + j);
                if (b < 0) break;
                if (run + hist_bin(rs, b) >= target) {
                    rs->prefix = (prefix << 10) | (unsigned)b;
                    rs->above = run;
                    break;
                }
                run += hist_bin(rs, b);
            }
        }
        __syncthreads();
        prefix = rs->prefix;
        ab = rs->above;
        __syncthreads();  // rs's and red's readers done before the next writes
    }
    above = ab;
    return prefix;
}
__device__ __forceinline__ unsigned long long prob_weight(float p) {
    return (unsigned long long)__fmul_rn(p, 1099511627776.0f);
}
// One draw over the tokens mlaserve_model::draw::filtered keeps: the row (logits, max mx) is
// overwritten with its probabilities; min-p, then top-k by a count radix select over the keys
// and the ties' id cut, then top-p by a weight radix select and its ties' cut, then the draw.
__device__ int pick_filtered(float* row, int n, float mx, float inv_t, unsigned long long random,
                             unsigned top_k, float top_p, float min_p, unsigned long long* red,
                             int* found, RadixScratch* rs) {
    const float* prob = row;
    const float min_keep = min_p > 0.0f ? min_p : 0.0f;
    auto k0 = [=](float p) { return p > 0.0f && p >= min_keep; };
    // the probabilities written over the logits, counting those min-p keeps
    const unsigned long long n0 = block_sum_u64(
        row, n,
        [&](int i, float l) {
            const float p = softmax_prob(l, mx, inv_t);
            row[i] = p;
            return k0(p) ? 1ull : 0ull;
        },
        red);
    bool use_k = false;
    unsigned vk = 0;
    int cut_k = -1;
    if (top_k != 0u && (unsigned long long)top_k < n0) {
        use_k = true;
        unsigned long long above;
        vk = radix_key(n, prob, [&](int, float p) { return k0(p) ? 1ull : 0ull; }, top_k, above,
                       red, rs);
        cut_k = block_find(
            n,
            [&](int i) {
                const float p = prob[i];
                return k0(p) && __float_as_uint(p) == vk ? 1ull : 0ull;
            },
            top_k - above - 1, red, found);
    }
    auto k1 = [=](int i, float p) {
        const unsigned key = __float_as_uint(p);
        return k0(p) && (!use_k || key > vk || (key == vk && i <= cut_k));
    };
    const bool use_p = top_p < 1.0f;
    unsigned vp = 0;
    int cut_p = -1;
    if (use_p) {
        const unsigned long long total = block_sum_u64(
            prob, n, [&](int i, float p) { return k1(i, p) ? prob_weight(p) : 0ull; }, red);
        // mlaserve_model::draw::nucleus_target
        unsigned long long target =
            (unsigned long long)ceil(__dmul_rn((double)top_p, __ull2double_rn(total)));
        target = max(min(target, total), 1ull);  // draw::rank_cut's need.max(1)
        unsigned long long above;
        vp = radix_key(n, prob, [&](int i, float p) { return k1(i, p) ? prob_weight(p) : 0ull; },
                       target, above, red, rs);
        cut_p = block_find(
            n,
            [&](int i) {
                const float p = prob[i];
                return k1(i, p) && __float_as_uint(p) == vp ? prob_weight(p) : 0ull;
            },
            target - above - 1, red, found);
    }
    auto k2 = [=](int i, float p) {
        const unsigned key = __float_as_uint(p);
        return k1(i, p) && (!use_p || key > vp || (key == vp && i <= cut_p));
    };
    auto w2 = [&](int i, float p) { return k2(i, p) ? prob_weight(p) : 0ull; };
    const unsigned long long total = block_sum_u64(prob, n, w2, red);
    return block_find(n, [&](int i) { return w2(i, prob[i]); }, __umul64hi(random, total), red,
                      found);
}
extern "C" __global__ void logits_pick(float* logits, int vocab, const unsigned* draws,
                                       uint4* out, unsigned* picked) {
    MLA_PDL();
    __shared__ float sv[32];
    __shared__ unsigned si[32], sb[32];
    __shared__ unsigned long long wsum[32], rem_s;
    __shared__ int warp_s;
    __shared__ RadixScratch rs;
    float* row = logits + (i64)blockIdx.x * vocab;
    float bv = -INFINITY;
    unsigned bi = 0xffffffffu, badi = 0xffffffffu;
    if ((vocab & 3) == 0) {  // rows 16-byte aligned: float4 loads
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int j = threadIdx.x; j < vocab / 4; j += blockDim.x) {
            const float4 q = r4[j];
            const unsigned i = 4u * j;
            argmax_take(q.x, i, bv, bi, badi);
            argmax_take(q.y, i + 1, bv, bi, badi);
            argmax_take(q.z, i + 2, bv, bi, badi);
            argmax_take(q.w, i + 3, bv, bi, badi);
        }
    } else {
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) argmax_take(row[j], j, bv, bi, badi);
    }
    argmax_warp(bv, bi, badi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
        sb[warp] = badi;
    }
    __syncthreads();
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0xffffffffu;
    badi = lane < nw ? sb[lane] : 0xffffffffu;
    argmax_warp(bv, bi, badi);  // every warp: the row's (max, index, first unusable)
    const unsigned token = bv == -INFINITY ? 0u : bi;  // none above -inf: token 0, as the reference
    if (threadIdx.x == 0) {
        const unsigned bad_bits = badi == 0xffffffffu ? 0u : __float_as_uint(row[badi]);
        out[blockIdx.x] = make_uint4(token, __float_as_uint(bv), badi, bad_bits);
        picked[blockIdx.x] = token;
    }
    const unsigned* d = draws ? draws + 8 * blockIdx.x : nullptr;
    if (!d || d[3] == 0u || badi != 0xffffffffu || bv == -INFINITY) return;  // block-uniform
    {
        const float top_p = __uint_as_float(d[5]), min_p = __uint_as_float(d[6]);
        if (!(d[4] == 0u && top_p >= 1.0f && min_p <= 0.0f)) {
            const unsigned long long random = ((unsigned long long)d[2] << 32) | d[1];
            const int t = pick_filtered(row, vocab, bv, __uint_as_float(d[0]), random, d[4], top_p,
                                        min_p, wsum, &warp_s, &rs);
            if (threadIdx.x == 0) picked[blockIdx.x] = t;
            return;
        }
    }
    // The draw. Warp w sums the weights of its segment [w sg, w sg + sg) of the row in steps
    // of 32 e values (a lane's e = 4 consecutive ones: float4 loads, coalesced; e = 1 where
    // the row is not float4-aligned); thread 0 finds the segment where the running sum passes
    // target = (random * total) >> 64; that warp finds the step (a lane a step, 32 at a time),
    // then the lane, then the value.
    const float inv_t = __uint_as_float(d[0]);
    const unsigned long long random = ((unsigned long long)d[2] << 32) | d[1];
    const int e = (vocab & 3) == 0 ? 4 : 1, w32 = 32 * e;
    const int sg = (vocab + nw * w32 - 1) / (nw * w32) * w32;
    const int lo = min(vocab, warp * sg), hi = min(vocab, lo + sg);
    unsigned long long mine = 0;
    for (int j = lo + lane * e; j < hi; j += w32) mine += pick_weights(row, j, e, bv, inv_t);
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    if (lane == 0) wsum[warp] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long total = 0, base = 0;
        for (int w = 0; w < nw; ++w) total += wsum[w];
        const unsigned long long target = __umul64hi(random, total);  // < total: total >= 2^40
        int w = 0;
        while (base + wsum[w] <= target) base += wsum[w++];
        warp_s = w;
        rem_s = target - base;
    }
    __syncthreads();
    if (warp != warp_s) return;
    unsigned long long rem = rem_s;
    for (int g = lo; g < hi; g += 32 * w32) {  // 32 steps: lane l sums step l's 32 e values
        const int st = g + lane * w32;
        unsigned long long s = 0;
        for (int j = st; j < min(st + w32, hi); j += e) s += pick_weights(row, j, e, bv, inv_t);
        unsigned long long incl = warp_incl_u64(s, lane);
        const unsigned hit = __ballot_sync(0xffffffffu, incl > rem);
        if (!hit) {
            rem -= __shfl_sync(0xffffffffu, incl, 31);
            continue;
        }
        const int k = __ffs(hit) - 1;  // the step; its lanes' e values each
        rem -= __shfl_sync(0xffffffffu, incl - s, k);
        const int j0 = g + k * w32 + lane * e;
        s = j0 < hi ? pick_weights(row, j0, e, bv, inv_t) : 0ull;
        incl = warp_incl_u64(s, lane);
        const unsigned at = __ballot_sync(0xffffffffu, incl > rem);
        if (lane == __ffs(at) - 1) {
            unsigned long long cum = incl - s;
            for (int j = j0; j < j0 + e; ++j) {
                cum += softmax_weight(row[j], bv, inv_t);
                if (cum > rem) {
                    picked[blockIdx.x] = j;
                    break;
                }
            }
        }
        return;
    }
}
