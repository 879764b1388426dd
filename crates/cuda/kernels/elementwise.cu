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
