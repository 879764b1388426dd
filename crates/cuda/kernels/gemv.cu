// Dense bf16 GEMV for decode steps (M <= 4 rows of x): one launch for up to two weight
// matrices that read the same x (q_proj|q_a and kv_a_proj), optionally with the RMSNorm that
// makes x in its prologue, and (where the host asks: gemv.rs) an L2 prefetch of the block's
// weight rows issued before the wait on the previous grid (weights are never written by a
// kernel, so that read cannot race; with PDL it overlaps the previous kernel's tail), and each
// warp's first K steps loaded into registers before that wait too (GemvRows: all of K <= 2,048
// at one vector).
//
// out_j[m, r] (= or +=) W_j[r, :] . x[m, :] for j = 0, 1; W_j bf16 [r_j, k], out_j f32 with
// row stride ld_j. x is xb bf16 [M, k] (row stride k), or, where gamma is non-null,
// bf16(RMSNorm(xf[m, :]) * gamma) computed as rms_norm does (same block size and sums, so
// the bf16 rows are bit-identical to its output; block 0 also stores them in hnb if
// non-null). x lives in shared memory (M * k bf16, dynamic). grid (ceil((r0 + r1) / 16)),
// block 256: two rows a warp, both rows' loads in flight together.
// A warp's two weight rows and their first PRE K steps, loaded before the wait on the previous
// grid (weights are never written by a kernel): after the wait only x is fetched before the
// first products. One vector: PRE = 8, all of K up to 2,048, so no weight round trip is left
// on the step's critical path (123 registers, two blocks an SM; session 34: a V2-Lite b1 step
// −5 µs against 4 on an H100); more vectors: 4 (at 8 they take 140 registers, one block an
// SM). So is the norm's gamma where K <= 2,048 (8 registers a thread: gemv_gamma).
template <int PRE>
struct GemvRows {
    const bf16* w[2];
    float* out[2];
    int ld[2];
    bool live;             // ra < rows: the warp has a row
    uint4 a[PRE], b[PRE];  // K steps c = lane * 8 + 256 u, u < PRE, of rows 0 and 1
};
__host__ __device__ constexpr int gemv_pre(int mt) { return mt == 1 ? 8 : 4; }

template <int PRE>
__device__ __forceinline__ void gemv_rows(GemvRows<PRE>& g, const bf16* w0, int r0, float* out0,
                                          int ld0, const bf16* w1, int r1, float* out1, int ld1,
                                          int k) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = r0 + r1, ra = blockIdx.x * 16 + warp * 2;
    g.live = ra < rows;
    if (!g.live) return;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int r = min(ra + j, rows - 1);  // a last odd row is computed twice, stored once
        bool first = r < r0;
        g.w[j] = first ? w0 + (i64)r * k : w1 + (i64)(r - r0) * k;
        g.out[j] = first ? out0 + r : out1 + (r - r0);
        g.ld[j] = first ? ld0 : ld1;
    }
#pragma unroll
    for (int u = 0; u < PRE; u++) {
        int c = lane * 8 + u * 256;
        if (c < k) {
            g.a[u] = *(const uint4*)(g.w[0] + c);
            g.b[u] = *(const uint4*)(g.w[1] + c);
        }
    }
}

// The products of one K step c (a lane's 8 values) of the warp's two rows with x's rows.
template <int MT>
__device__ __forceinline__ void gemv_step(float (&s)[2][MT], const uint4& a, const uint4& b,
                                          const bf16* xs, int k, int m, int c) {
    const bf16* aa = (const bf16*)&a;
    const bf16* bb = (const bf16*)&b;
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
        if (mi < m) {
            uint4 xv = *(const uint4*)(xs + mi * k + c);
            const bf16* xe = (const bf16*)&xv;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                s[0][mi] += bf2f(aa[e]) * bf2f(xe[e]);
                s[1][mi] += bf2f(bb[e]) * bf2f(xe[e]);
            }
        }
    }
}

// The norm's gamma for a thread's 8 elements i = threadIdx.x + 256 u, read before the wait
// where K <= 2,048 (one pass of the norm's loop: gemv_bf16_body).
__device__ __forceinline__ void gemv_gamma(float* gv, const float* gamma, int k) {
    if (!gamma || k > 8 * (int)blockDim.x) return;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int i = threadIdx.x + u * blockDim.x;
        gv[u] = i < k ? gamma[i] : 0.f;
    }
}

template <int MT, int PRE>
__device__ __forceinline__ void gemv_bf16_body(const GemvRows<PRE>& g, const float* xf,
                                               const float* gamma, float eps, const bf16* xb,
                                               int k, int m, int rows, int acc, bf16* hnb,
                                               const float* gpre) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    bf16* xs = (bf16*)gemv_smem;
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (gamma) {
        // rms_norm's arithmetic with 8 loads in flight a thread (rms_inv_8, common.cuh).
        const int nt = blockDim.x;
        for (int mi = 0; mi < m; mi++) {
            const float* xr = xf + (i64)mi * k;
            const float inv = rms_inv_8(xr, k, eps, red);
            for (int i0 = threadIdx.x; i0 < k; i0 += 8 * nt) {
                float xv[8], gv[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int i = i0 + u * nt;
                    xv[u] = i < k ? xr[i] : 0.f;
                    gv[u] = k <= 8 * nt ? gpre[u] : i < k ? gamma[i] : 0.f;
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int i = i0 + u * nt;
                    if (i >= k) break;
                    bf16 b = f2bf(xv[u] * inv * gv[u]);
                    xs[mi * k + i] = b;
                    if (hnb && blockIdx.x == 0) hnb[(i64)mi * k + i] = b;
                }
            }
        }
    } else {
        for (int i = threadIdx.x * 8; i < m * k; i += blockDim.x * 8)
            *(uint4*)(xs + i) = *(const uint4*)(xb + i);
    }
    __syncthreads();
    if (!g.live) return;
    const int ra = blockIdx.x * 16 + warp * 2;
    float s[2][MT];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int mi = 0; mi < MT; mi++) s[j][mi] = 0.f;
    // The steps that came with g, then the rest four at a time, each four requested before
    // any is used: 8 loads of 16 bytes in flight a lane (a 2,048-row matrix gives only 128
    // blocks, one an SM: the loads in flight, not the warps, must cover the memory latency).
    // Every lane adds its steps in order of c, whichever loaded them.
#pragma unroll
    for (int u = 0; u < PRE; u++) {
        const int c = lane * 8 + u * 256;
        if (c >= k) break;
        gemv_step<MT>(s, g.a[u], g.b[u], xs, k, m, c);
    }
    for (int c0 = lane * 8 + PRE * 256; c0 < k; c0 += 4 * 32 * 8) {
        uint4 a[4], b[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + u * 256;
            if (c < k) {
                a[u] = *(const uint4*)(g.w[0] + c);
                b[u] = *(const uint4*)(g.w[1] + c);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + u * 256;
            if (c >= k) break;
            gemv_step<MT>(s, a[u], b[u], xs, k, m, c);
        }
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (j == 1 && ra + 1 >= rows) break;
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            if (mi < m) {
                float v = warp_sum(s[j][mi]);
                if (lane == 0) {
                    float* o = g.out[j] + (i64)mi * g.ld[j];
                    *o = acc ? *o + v : v;
                }
            }
        }
    }
}

// The L2 prefetch of block b's 16 weight rows (lines of 128 bytes), before MLA_PDL().
__device__ __forceinline__ void gemv_prefetch(const bf16* w0, int r0, const bf16* w1, int r1,
                                              int k, int on) {
    if (!on) return;
    const int rows = r0 + r1, lines = (k * 2 + 127) / 128;
    const int ra = blockIdx.x * 16;
    for (int i = threadIdx.x; i < 16 * lines; i += blockDim.x) {
        int r = ra + i / lines;
        if (r >= rows) break;
        const bf16* p = (r < r0 ? w0 + (i64)r * k : w1 + (i64)(r - r0) * k) + (i % lines) * 64;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

#define GEMV_BF16(MT)                                                                           \
    extern "C" __global__ void gemv_bf16_m##MT(                                                \
        const float* xf, const float* gamma, float eps, const bf16* xb, int k, int m,          \
        const bf16* w0, int r0, float* out0, int ld0, const bf16* w1, int r1, float* out1,     \
        int ld1, int acc, bf16* hnb, int prefetch) {                                           \
        MLA_WEIGHTS_FIRST();                                                                   \
        gemv_prefetch(w0, r0, w1, r1, k, prefetch);                                            \
        GemvRows<gemv_pre(MT)> g;                                                              \
        gemv_rows(g, w0, r0, out0, ld0, w1, r1, out1, ld1, k);                                 \
        float gv[8];                                                                           \
        gemv_gamma(gv, gamma, k);                                                              \
        MLA_PDL();                                                                             \
        gemv_bf16_body<MT, gemv_pre(MT)>(g, xf, gamma, eps, xb, k, m, r0 + r1, acc, hnb, gv);  \
    }
GEMV_BF16(1)
GEMV_BF16(2)
GEMV_BF16(4)
