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
