// Kernel lab (examples/grid_barrier.rs): what one dependent hand-off costs between kernels
// (PDL boundaries) and inside one kernel (a grid barrier), measured the same way: every block
// reads a word its neighbour block wrote before the boundary, so the boundary is only passed
// when that write is visible. No engine path launches these.

// One boundary of a chain of kernels: block b reads prev[(b + 1) % nb] (written by the kernel
// before) and writes next[b] = that + 1; err[0] counts reads of a value other than `want`.
// grid (nb), block 256.
extern "C" __global__ void lab_handoff(const unsigned* prev, unsigned* next, unsigned want,
                                       unsigned* err) {
    MLA_PDL();
    if (threadIdx.x != 0) return;
    const unsigned nb = gridDim.x, b = blockIdx.x;
    const unsigned v = prev[(b + 1) % nb];
    if (v != want) atomicAdd(err, 1u);
    next[b] = v + 1;
}

// The grid barrier: bar[0] counts arrivals, bar[1] is the generation. Thread 0 reads the
// generation (acquire: before it arrives), arrives (acq_rel: the block's writes before the
// barrier are released with it), and the last to arrive resets the count and publishes the
// next generation (release); the others spin until they see it (acquire). Every block must
// be resident at once (grid <= what the SMs hold). `limit` bounds the spin in polls; past it
// the barrier gives up and counts the timeout in err[1] (no hang on a grid too large).
__device__ __forceinline__ void grid_sync(unsigned* bar, unsigned* err, unsigned limit) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned gen, old;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(bar + 1) : "memory");
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;"
                     : "=r"(old)
                     : "l"(bar)
                     : "memory");
        if (old == gridDim.x * gridDim.y - 1) {
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 1), "r"(gen + 1)
                         : "memory");
        } else {
            unsigned now = gen;
            for (unsigned i = 0; now == gen; i++) {
                if (i == limit) {
                    atomicAdd(err + 1, 1u);
                    break;
                }
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(now)
                             : "l"(bar + 1)
                             : "memory");
            }
        }
    }
    __syncthreads();
}

// `rounds` hand-offs inside one kernel: in round i block b writes data[(i & 1) * nb + b] =
// base + i, passes the grid barrier, and reads its neighbour's word of that round (err[0]
// counts a wrong one). rounds = 0 is the bare launch. grid (nb <= resident blocks), block 256.
extern "C" __global__ void lab_grid_sync(unsigned* bar, unsigned* data, int rounds,
                                         unsigned base, unsigned* err) {
    MLA_PDL();
    const unsigned nb = gridDim.x, b = blockIdx.x;
    for (int i = 0; i < rounds; i++) {
        if (threadIdx.x == 0) data[(i & 1) * nb + b] = base + i;
        grid_sync(bar, err, 1u << 24);
        if (threadIdx.x == 0 && data[(i & 1) * nb + (b + 1) % nb] != base + i) atomicAdd(err, 1u);
    }
}

// The phase trace (common.cuh, MLA_TRACE) into out [MLA_TRACE_BLOCKS * 17]: the stamps
// [MLA_TRACE_BLOCKS * 16], then the blocks' SMs [MLA_TRACE_BLOCKS]; cleared behind (SMs to
// -1). grid 1, block 256.
extern "C" __global__ void mla_trace_read(long long* out) {
    MLA_PDL();
    for (int i = threadIdx.x; i < MLA_TRACE_BLOCKS * 16; i += blockDim.x) {
        out[i] = mla_trace_buf[i];
        mla_trace_buf[i] = 0;
    }
    for (int i = threadIdx.x; i < MLA_TRACE_BLOCKS; i += blockDim.x) {
        out[MLA_TRACE_BLOCKS * 16 + i] = mla_trace_sm[i];
        mla_trace_sm[i] = -1;
    }
}

// The read ceiling (examples/read_bw.rs): what the GPU streams from HBM when a kernel only
// reads, against which the expert GEMVs' bytes a second are judged (the issue's roofline
// takes the device copy's 3,970 GB/s, bytes read + written).
//
// One 16-byte load of src[i]: HINT 0 ld.global.nc; 1 with L1::no_allocate and an L2 prefetch
// of the 256-byte sector group.
template <int HINT>
__device__ __forceinline__ uint4 lab_ld(const uint4* p) {
    uint4 v;
    if constexpr (HINT == 0) {
        asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    } else {
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    }
    return v;
}

// src [n16] uint4 read grid-stride, U loads a thread in flight (a warp's load is 512
// contiguous bytes; a thread's U loads are a grid apart). The xor of everything goes to
// sink[0] only if it is a value no test input gives, so the loads stay. grid any, block 256.
template <int U, int HINT>
__device__ __forceinline__ void lab_read_body(const uint4* src, long long n16, unsigned* sink) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = lab_ld<HINT>(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = lab_ld<HINT>(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}
// (Bounded for 4 blocks an SM, 8 at U = 1: unbounded, ptxas keeps 32 registers and consumes
// a load before it issues the fifth. Asm without volatile: ptxas may schedule the loads.)
#define LAB_READ(NAME, U, HINT)                                                               \
    extern "C" __global__ void __launch_bounds__(256, U == 1 ? 8 : 4) NAME(                    \
        const uint4* src, long long n16, unsigned* sink) {                                     \
        MLA_PDL();                                                                             \
        lab_read_body<U, HINT>(src, n16, sink);                                               \
    }
LAB_READ(lab_read_u1, 1, 0)
LAB_READ(lab_read_u4, 4, 0)
LAB_READ(lab_read_u8, 8, 0)
LAB_READ(lab_read_u4h, 4, 1)
LAB_READ(lab_read_u8h, 8, 1)

// The expert GEMV's access pattern without its arithmetic: a warp a pair of rows of n bf16
// (rows 2j and 2j + 1 of src, n % 256 == 0), S K steps of 256 values of both rows in flight
// (a lane's 16 bytes a step, as warp_2rows_dot's load_2rows4 with S = 4). PERSIST 0: grid
// (rows / 16), a row pair a warp, as moe_gemv_swiglu; 1: any grid, warps walk the row pairs.
// The xor of rows r0 and r1 (n bf16 each), lane's 16 bytes a K step, S steps of both rows in
// flight (none past n).
template <int S>
__device__ __forceinline__ unsigned lab_xor_2rows(const bf16* r0, const bf16* r1, int n,
                                                  int lane) {
    unsigned acc = 0;
    for (int c0 = lane * 8; c0 < n; c0 += S * 256) {
        uint4 a[S], b[S];
#pragma unroll
        for (int u = 0; u < S; u++) {
            const int c = c0 + u * 256;
            a[u] = b[u] = make_uint4(0u, 0u, 0u, 0u);
            if (c < n) {
                a[u] = lab_ld<0>((const uint4*)(r0 + c));
                b[u] = lab_ld<0>((const uint4*)(r1 + c));
            }
        }
#pragma unroll
        for (int u = 0; u < S; u++)
            acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ b[u].x ^ b[u].y ^ b[u].z ^ b[u].w;
    }
    return acc;
}

template <int S, int PERSIST>
__device__ __forceinline__ void lab_rows_body(const bf16* src, int rows, int n, unsigned* sink) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int w0 = blockIdx.x * warps + (threadIdx.x >> 5);
    const int step = PERSIST ? gridDim.x * warps : rows;
    unsigned acc = 0;
    for (int j = w0; 2 * j + 1 < rows; j += step) {
        const bf16* r0 = src + (long long)(2 * j) * n;
        acc ^= lab_xor_2rows<S>(r0, r0 + n, n, lane);
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}
#define LAB_ROWS(NAME, S, PERSIST)                                                           \
    extern "C" __global__ void __launch_bounds__(256, S == 8 ? 2 : 4) NAME(                   \
        const bf16* src, int rows, int n, unsigned* sink) {                                    \
        MLA_PDL();                                                                             \
        lab_rows_body<S, PERSIST>(src, rows, n, sink);                                       \
    }
LAB_ROWS(lab_rows_s4, 4, 0)
LAB_ROWS(lab_rows_s8, 8, 0)
LAB_ROWS(lab_rows_s4p, 4, 1)
LAB_ROWS(lab_rows_s8p, 8, 1)

// The copy gpu.md measured the ceiling with: dst[i] = src[i], 16 bytes a thread, grid-stride.
extern "C" __global__ void __launch_bounds__(256) lab_copy(const uint4* src, uint4* dst,
                                                           long long n16) {
    MLA_PDL();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride)
        dst[i] = src[i];
}

// moe_gemv_swiglu's work taken apart (examples/read_bw.rs): grid (f / 8, pairs), block 256, a
// warp a row i of pair p's gate and up rows (f apart; pair p's gate|up at w + p * 2 f n).
// MODE 0: the loads only (xor, as lab_rows_s4); 1: and the dot products against x, the warp
// sums, the SwiGLU and the store (warp_2rows_dot, as moe_gemv_swiglu); 2: 1 with the matrix
// found as moe_gemv_swiglu finds it after its wait (ids[p], then the pointer table; the table
// not staged in shared memory).
template <int MODE>
__device__ __forceinline__ void lab_swiglu_body(const bf16* w, const unsigned long long* w_ptrs,
                                                const int* ids, const bf16* x, int n, int f,
                                                bf16* act, unsigned* sink) {
    const int lane = threadIdx.x & 31, i = blockIdx.x * 8 + (threadIdx.x >> 5), p = blockIdx.y;
    if (i >= f) return;
    const bf16* wp = MODE == 2 ? (const bf16*)w_ptrs[ids[p]] : w + (i64)p * 2 * f * n;
    const bf16* w0 = wp + (i64)i * n;
    const bf16* w1 = wp + (i64)(f + i) * n;
    if (MODE == 0) {
        if (lab_xor_2rows<4>(w0, w1, n, lane) == 0x9e3779b9u) sink[0] = 1u;
        return;
    }
    float g = 0.f, u = 0.f;
    warp_2rows_dot(w0, w1, x, n, lane, g, u);
    if (lane == 0) act[(i64)p * f + i] = f2bf(g / (1.f + __expf(-g)) * u);
}
// (MODE 0 bounded for 4 blocks an SM, as lab_rows_s4: unbounded ptxas consumes loads early;
// 1 and 2 unbounded, as moe_gemv_swiglu.)
#define LAB_SWIGLU(NAME, MODE, BOUNDS)                                                         \
    extern "C" __global__ void BOUNDS NAME(const bf16* w, const unsigned long long* w_ptrs,    \
                                    const int* ids, const bf16* x, int n, int f, bf16* act,    \
                                    unsigned* sink) {                                          \
        MLA_PDL();                                                                             \
        lab_swiglu_body<MODE>(w, w_ptrs, ids, x, n, f, act, sink);                             \
    }
LAB_SWIGLU(lab_swiglu_m0, 0, __launch_bounds__(256, 4))
LAB_SWIGLU(lab_swiglu_m1, 1, )
LAB_SWIGLU(lab_swiglu_m2, 2, )
