// Shared by every kernel file (NVRTC compiles them as one translation unit, no headers).
// bf16 is carried as its bit pattern; conversion rounds to nearest even like half::bf16.
typedef unsigned short bf16;
typedef long long i64;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Programmatic dependent launch (sm_90+). The host launches every kernel with the programmatic
// stream serialization attribute (Gpu::launch), so a kernel may be scheduled while the one
// before it in the stream still runs: its launch latency hides behind that kernel's tail.
// Hence the first statement of every kernel is MLA_PDL(): wait until the preceding grid has
// completed and its memory is visible (before any read or write, so no ordering is lost), then
// let the next kernel be scheduled. Elsewhere (and without the attribute) it does nothing.
// kernels.rs's tests check that every kernel starts with it.
//
// The first exception: a kernel may read weights (never written by any kernel, so no ordering
// with the previous grid exists for them) before its MLA_PDL(), e.g. to prefetch them into L2
// while the previous kernel finishes. It starts with the marker MLA_WEIGHTS_FIRST(); instead,
// and the kernels.rs test then wants MLA_PDL(); in its body, or in the device function it
// runs before that function's first read of anything a kernel writes (qgemv.cu's qmv_t: the
// pairs wait before reading the routing's ids — but under the third exception below — dense
// after requesting its first weight steps and before reading x). One more read is allowed there,
// only where the host says so (mla_decode_w64's `early`): inputs written before the previous
// kernel began. A kernel starts only once every block of the one before it has passed that
// kernel's own MLA_PDL(), i.e. once the kernel before that has completed.
// MLA_PDL_WAIT() then MLA_PDL_LAUNCH() later is MLA_PDL() split: a kernel that wants the next
// one let in later than its wait (moe_norm_route_cl's `late`); the rule above still holds,
// since a block reaches the launch only after its wait (an exit counts as a launch).
// The second exception (Gpu::shared_nowait, sm_90 only; `MLASERVE_SHARED_NOWAIT=0` turns it
// off): after moe_norm_route_cl, moe_gemv_swiglu's shared-slice blocks run without waiting,
// reading the routing's hnb rows with ld.global.cg; block 0 (rank 0) of each token's cluster
// fences them at gpu scope (`late` bit 2: a fence that completes once the stores are performed
// in L2) before any block of that cluster lets the GEMV in. PTX's memory model does not name
// a fence-then-trigger order: this is the H200's behaviour, which the e2e and graph tests
// exercise on the real chain (the op table's "slices without the wait" row checks only the
// kernel's bits, with x written before it). The slices may also write act early: every
// routing block passed its own wait before letting the GEMV in, so all kernels before the
// routing have completed, and the routing never touches act. The routed blocks still wait,
// so the rule holds for the kernel after (the host keeps at least one routed block).
// The third exception (Gpu::moe_gemv_combine_after's `ids_final`, moe_gemv_combine's `tab_on`
// bit 1): the combine reads the routing's ids (ld.global.cg) and its first weight rows before
// its wait. The kernel before it is moe_gemv_swiglu over the same ids, whose routed blocks
// pass their wait (on the routing) before `if (i >= f) return;` and before letting the combine
// in, so every block of the combine starts after the routing has completed; what the
// SwiGLU kernel writes (act) and the combine's other inputs (wts, x) are read after the wait.
// The same for qgemv.cu's qmv_t over pairs under `accumulate` bit 1 (Gpu::qmv_pairs_after:
// the quantized down GEMV after the gate|up pairs GEMV, every block of which waits first; or,
// without the SwiGLU epilogue, after silu_mul, which waits in every block too).
// As with the second exception, that the completed routing's stores are in L2 for a grid
// that did not wait on it is the hardware's behaviour, not PTX's model; the e2e and graph
// tests run it on the real chain.
#define MLA_WEIGHTS_FIRST() \
    do {                    \
    } while (0)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLA_PDL() asm volatile("griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n" ::: "memory")
#define MLA_PDL_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#define MLA_PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#else
#define MLA_PDL() \
    do {          \
    } while (0)
#define MLA_PDL_WAIT() \
    do {               \
    } while (0)
#define MLA_PDL_LAUNCH() \
    do {                 \
    } while (0)
#endif

// Phase trace (a timing lab, `MLASERVE_KERNEL_TRACE=1` compiles with MLA_TRACE): thread 0 of
// block b < MLA_TRACE_BLOCKS writes %clock64 at point i < 14 into mla_trace_buf[16 b + i] and
// %globaltimer at MLA_TRACE_G0 / MLA_TRACE_G1 into words 14 / 15, overwritten by every launch
// (the host reads the last: lab.cu's mla_trace_read). Without MLA_TRACE the points are empty.
// MLA_TRACE_G0 also writes the block's SM (%smid) into mla_trace_sm[b]: whether a launch's
// blocks share SMs.
#define MLA_TRACE_BLOCKS 256
__device__ long long mla_trace_buf[MLA_TRACE_BLOCKS * 16];
__device__ int mla_trace_sm[MLA_TRACE_BLOCKS];
#ifdef MLA_TRACE
#define MLA_TRACE_AT(i, reg)                                                            \
    do {                                                                                \
        if (threadIdx.x == 0 && blockIdx.x < MLA_TRACE_BLOCKS) {                        \
            long long c_;                                                               \
            asm volatile("mov.u64 %0, %%" reg ";" : "=l"(c_)::"memory");                \
            mla_trace_buf[blockIdx.x * 16 + (i)] = c_;                                  \
        }                                                                               \
    } while (0)
#define MLA_T(i) MLA_TRACE_AT(i, "clock64")
#define MLA_TRACE_G0()                                                    \
    do {                                                                  \
        MLA_TRACE_AT(14, "globaltimer");                                  \
        if (threadIdx.x == 0 && blockIdx.x < MLA_TRACE_BLOCKS) {          \
            unsigned sm_;                                                 \
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));              \
            mla_trace_sm[blockIdx.x] = (int)sm_;                          \
        }                                                                 \
    } while (0)
#define MLA_TRACE_G1() MLA_TRACE_AT(15, "globaltimer")
#else
#define MLA_T(i) \
    do {         \
    } while (0)
#define MLA_TRACE_G0() MLA_T(0)
#define MLA_TRACE_G1() MLA_T(0)
#endif

__device__ __forceinline__ float bf2f(bf16 v) { return __uint_as_float(((unsigned)v) << 16); }

__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// s0 += a[u] . x[c], s1 += b[u] . x[c] for the steps u < 4 with c = c0 + 256 u < n: two rows'
// four loaded 8-value K steps (lane's column c0) against x, in warp_row_dot's order (moe.cu).
__device__ __forceinline__ void dot2_steps4(const uint4* a, const uint4* b, const bf16* x, int c0,
                                            int n, float& s0, float& s1) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int c = c0 + u * 256;
        if (c >= n) break;
        const uint4 xv = *(const uint4*)(x + c);
        const bf16* aa = (const bf16*)&a[u];
        const bf16* bb = (const bf16*)&b[u];
        const bf16* xe = (const bf16*)&xv;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s0 += bf2f(aa[j]) * bf2f(xe[j]);
            s1 += bf2f(bb[j]) * bf2f(xe[j]);
        }
    }
}

// An int read through L2 (ld.global.cg): never a line an earlier kernel left in this SM's L1
// (inputs read before a PDL wait that a kernel two or more back wrote).
__device__ __forceinline__ int ld_cg_s32(const int* p) {
    int v;
    asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum/max for blockDim.x a multiple of 32 (<= 1024). `red` holds 32 floats.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = (threadIdx.x < (blockDim.x >> 5)) ? red[threadIdx.x] : 0.f;
    if (w == 0) t = warp_sum(t);
    if (threadIdx.x == 0) red[0] = t;
    __syncthreads();
    return red[0];
}

// A shared-memory pointer as the 32-bit address of the .shared window (for PTX operands).
__device__ __forceinline__ unsigned mla_smem(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The address of this block's shared-memory object p in block `block` of the cluster
// (distributed shared memory), for ld.shared::cluster.
__device__ __forceinline__ unsigned cl_remote(const void* p, unsigned block) {
    unsigned r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(mla_smem(p)), "r"(block));
    return r;
}

// One float of a block of the cluster (an address from cl_remote).
__device__ __forceinline__ float cl_ld_f32(unsigned addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
#endif

__device__ float block_max(float v, float* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = (threadIdx.x < (blockDim.x >> 5)) ? red[threadIdx.x] : -INFINITY;
    if (w == 0) t = warp_max(t);
    if (threadIdx.x == 0) red[0] = t;
    __syncthreads();
    return red[0];
}

// 1 / RMS of row xr [n] with rms_norm's sums (thread i adds elements i, i + blockDim.x, ... in
// order; block_sum), so its normalized values are bit-identical to rms_norm's, but with 8
// loads in flight a thread (a loop of one load a step waits out the L2 latency 8 times at
// n = 2048). Every thread of the block calls it.
__device__ float rms_inv_8(const float* xr, int n, float eps, float* red) {
    const int nt = blockDim.x;
    float ss = 0.f;
    for (int i0 = threadIdx.x; i0 < n; i0 += 8 * nt) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = i0 + u * nt < n ? xr[i0 + u * nt] : 0.f;
#pragma unroll
        for (int u = 0; u < 8; u++) ss += v[u] * v[u];
    }
    ss = block_sum(ss, red);
    return rsqrtf(ss / n + eps);
}
