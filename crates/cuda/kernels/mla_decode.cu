// Tensor-core absorbed MLA decode: the contract of attn_mqa_split (attention.cu), for the
// DeepSeek/GLM latent row L = 512, R = 64 (cache rows [L | R] bf16, 576 wide; V = the first
// 512 columns of the same row), followed by attn_mqa_combine.
//
// A block is (token, group of 16 or 32 heads, split of the key list), 8 warps; the grid is
// 1-D with the head group fastest, so the blocks that read the same cache rows run side by
// side and share them in L2. Each 64-key tile of cache rows is copied once into shared memory
// (cp.async, 2-3 stages) and used by every head of the group: S = Q·K^T on m16n8k16 bf16 mma
// with f32 accumulators, online softmax in f32 (exp2 with scale·log2e folded in), P rounded
// to bf16 into shared memory, O += P·V with warp w owning output columns 64w..64w+63 of every
// head. Numerics: bf16 q, cache and P; f32 scores, softmax, sums and accumulators.
//
// Variants:
//   mla_decode_m1s3q  16 heads, 3 stages; Q in registers as A fragments (144 regs, loaded
//                     by ldmatrix from rows staged in the third stage's buffer before its
//                     first copy); warp w computes S for keys 8w..8w+7 over all 576 features.
//   mla_decode_m2s2   32 heads, 2 stages; Q in shared memory, same S split as m1s3q.
//   mla_decode_m1s2   16 heads, 2 stages; Q in shared memory (the plain version).
//   mla_decode_m2k    32 heads, 2 stages; S split over features: warp (kq, kn) holds Q for
//                     features 144kq..144kq+143 of all 32 heads in registers (72 regs) and
//                     computes the partial S of keys 32kn..32kn+31; the 4 partials are summed
//                     in shared memory by the softmax. Each K element is read from shared
//                     memory once per block (m2s2 reads Q once per warp and per key group).
//   mla_decode_m1s3b, mla_decode_m2kb: m1s3q and m2k with the cache rows brought in by the
//                     sm_90 copy engine (cp.async.bulk, one per row, on a per-stage mbarrier)
//                     instead of 16-byte cp.async from every thread (sm_90 and newer only);
//                     measured 15-25% slower than the cp.async versions on the H200.
// Measured figures and the choice per head count: bench/cuda/mla_decode.md.
// Outputs as attn_mqa_split: part [T, N, NS, 512] normalized per split, lse [T, N, NS]
// (natural log; -inf for an empty split). Heads past N in the last group are computed on
// zero queries and never written. Below sm_80 (no bf16 mma, no cp.async) the kernels trap,
// and the copy-engine ones below sm_90; the host wrapper never launches them there.

#define MLA_L 512
#define MLA_R 64
#define MLA_W 576              // cache row width (bf16)
#define MLA_BN 64              // keys per tile
#define MLA_ROW 584            // shared row stride in bf16: 1168 bytes, 16 mod 128 (no conflicts)
#define MLA_PROW 72            // P row stride in bf16: 144 bytes
#define MLA_SROW 72            // partial-S row stride in f32 (m2k): 288 bytes
#define MLA_THREADS 256
#define MLA_WARPS 8
#define MLA_CHUNKS 72          // 16-byte chunks per cache row
#define MLA_KSTEPS 36          // 576 / 16
#define MLA_TILE_BYTES (MLA_BN * MLA_ROW * 2)
static_assert(MLA_BN * 4 == MLA_THREADS, "the tile copy gives each thread a quarter of a row");

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MLA_TC 1

__device__ __forceinline__ void mla_cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mla_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void mla_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mla_ldsm4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void mla_ldsm4t(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a · b, m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mla_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to bf16x2 (round to nearest even): lo in the low half.
__device__ __forceinline__ unsigned mla_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float mla_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Query element (head h, column c of [q_lat | q_pe]) as f32; 0 for heads past nh.
__device__ __forceinline__ float mla_q(const float* q_lat, const float* q, int t, int h, int c,
                                       int nh, int p_dim) {
    if (h >= nh) return 0.f;
    if (c < MLA_L) return q_lat[((i64)t * nh + h) * MLA_L + c];
    return q[((i64)t * nh + h) * (p_dim + MLA_R) + p_dim + (c - MLA_L)];
}

// Q rows h0..h0+rows of token t as bf16 [rows][ROW] in shared memory: consecutive threads
// read consecutive columns (coalesced), zeros past nh.
__device__ __forceinline__ void mla_stage_q(bf16* dst, int rows, const float* q_lat, const float* q,
                                            int t, int h0, int nh, int p_dim) {
    for (int i = threadIdx.x; i < rows * (MLA_W / 2); i += MLA_THREADS) {
        int r = i / (MLA_W / 2), c = 2 * (i % (MLA_W / 2));
        *(unsigned*)(dst + r * MLA_ROW + c) = mla_pack(mla_q(q_lat, q, t, h0 + r, c, nh, p_dim),
                                                       mla_q(q_lat, q, t, h0 + r, c + 1, nh, p_dim));
    }
}

// One block's place in the grid and its key range.
struct MlaWork {
    int t, sp, h0, k0, k1, ntiles, so;
    const int* bt;
};

__device__ __forceinline__ MlaWork mla_work(int rows, int nh, int ns, const int* n_keys,
                                            const int* sel_off, const int* block_tables,
                                            const int* bt_off) {
    MlaWork w;
    const int ng = (nh + rows - 1) / rows;
    const int rest = blockIdx.x / ng;
    w.h0 = (blockIdx.x % ng) * rows;
    w.sp = rest % ns;
    w.t = rest / ns;
    const int nk = n_keys[w.t];
    const int per = (nk + ns - 1) / ns;
    w.k0 = min(nk, w.sp * per);
    w.k1 = min(nk, w.k0 + per);
    w.ntiles = (w.k1 - w.k0 + MLA_BN - 1) / MLA_BN;
    w.so = sel_off[w.t];
    w.bt = block_tables + bt_off[w.t];
    return w;
}

// The slots of a block's key tiles, one tile a step, for threads first..first+63 (one key
// each), with the global loads behind them issued ahead of their use: a DSA position two steps
// ahead, the block-table page one step ahead (a barrier right after loading them would wait
// out a memory round trip every tile).
struct MlaSlotPipe {
    int key;                  // this thread's key within a tile; active if 0 <= key < BN
    int pos, page, pos_next;  // the next tile's position and page, the one after's position

    __device__ __forceinline__ bool active() const { return (unsigned)key < MLA_BN; }

    __device__ __forceinline__ int position(const MlaWork& w, const int* sel_pos, int tile) const {
        const int kk = w.k0 + tile * MLA_BN + key;
        if (kk >= w.k1) return -1;
        return w.so < 0 ? kk : sel_pos[w.so + kk];
    }

    // Next tile `tile` (its page loaded here: once a block).
    __device__ __forceinline__ void start(const MlaWork& w, const int* sel_pos, int bs, int tile,
                                          int first = 0) {
        key = (int)threadIdx.x - first;
        if (active()) {
            pos = position(w, sel_pos, tile);
            page = pos < 0 ? 0 : w.bt[pos / bs];
            pos_next = position(w, sel_pos, tile + 1);
        }
    }

    // Writes tile `tile`'s slots (the next tile's) to dst [BN], then moves on by one.
    __device__ __forceinline__ void step(i64* dst, const MlaWork& w, const int* sel_pos, int bs,
                                         int tile) {
        if (active()) {
            dst[key] = pos < 0 ? -1 : (i64)page * bs + pos % bs;
            pos = pos_next;
            page = pos < 0 ? 0 : w.bt[pos / bs];
            pos_next = position(w, sel_pos, tile + 2);
        }
    }
};

// sm_90 copy engine: one bulk copy per cache row, completing on a per-stage mbarrier.
__device__ __forceinline__ void mla_bar_init(unsigned bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void mla_bar_init_fence() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mla_bar_expect(unsigned bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void mla_bar_wait(unsigned bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred P1;\n LAB_WAIT:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        " @P1 bra DONE;\n bra LAB_WAIT;\n DONE:\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
#endif
}

__device__ __forceinline__ void mla_bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
#endif
}

// Cache tiles into STAGES shared buffers. fill(tile) (threads 0..63, before the barrier that
// precedes issue) computes the tile's slots; issue(tile) starts its copy; wait(tile) returns
// once it has landed (for the calling thread: a barrier follows before other threads read).
// cp.async: 16 bytes per thread and request, rows past the split's end zero-filled by the
// copy. BULK (sm_90): warp 0 starts one copy-engine transfer per row (1,152 bytes) that
// completes on the stage's mbarrier, and zero-fills rows past the end with plain stores.
template <int STAGES, bool BULK>
struct MlaLoader {
    i64* slots;     // [STAGES][BN]
    unsigned kv;    // stage 0 (shared address)
    unsigned bars;  // [STAGES] mbarriers (shared address), BULK only

    // By every thread before the block's first barrier.
    __device__ __forceinline__ void init() const {
        if (BULK && threadIdx.x == 0) {
            for (int s = 0; s < STAGES; s++) mla_bar_init(bars + 8 * s);
            mla_bar_init_fence();
        }
    }

    __device__ __forceinline__ void fill(const MlaWork& w, int tile, const int* sel_pos, int bs) const {
        if (threadIdx.x < MLA_BN) {
            int kk = w.k0 + tile * MLA_BN + threadIdx.x;
            i64 s = -1;
            if (kk < w.k1) {
                int pos = w.so < 0 ? kk : sel_pos[w.so + kk];
                s = (i64)w.bt[pos / bs] * bs + pos % bs;
            }
            slots[(tile % STAGES) * MLA_BN + threadIdx.x] = s;
        }
    }

    // Starts tile `tile` if it exists (every thread calls it; cp.async groups stay counted).
    __device__ __forceinline__ void issue(const MlaWork& w, int tile, const bf16* cache) const {
        const int st = tile % STAGES;
        const i64* sl = slots + st * MLA_BN;
        const unsigned base = kv + st * MLA_TILE_BYTES;
        if constexpr (BULK) {
            if (tile < w.ntiles && threadIdx.x < 32) {
                const int cnt = min(MLA_BN, w.k1 - (w.k0 + tile * MLA_BN));
                const unsigned bar = bars + 8 * st;
                if (threadIdx.x == 0) mla_bar_expect(bar, (unsigned)cnt * (MLA_W * 2));
                for (int r = threadIdx.x; r < MLA_BN; r += 32) {
                    if (r < cnt) {
                        mla_bulk(base + r * MLA_ROW * 2, cache + sl[r] * MLA_W, MLA_W * 2, bar);
                    } else {
                        for (int c = 0; c < MLA_CHUNKS; c++)
                            asm volatile("st.shared.v4.u32 [%0], {%1,%1,%1,%1};\n" ::"r"(
                                             base + (r * MLA_ROW + c * 8) * 2),
                                         "r"(0u)
                                         : "memory");
                    }
                }
            }
        } else {
            // Thread t copies row t/4 (one slot read): 16-byte chunks t%4 + 4k at constant
            // offsets (a warp reads 64 contiguous bytes of each of 8 rows an instruction).
            if (tile < w.ntiles) {
                const int r = threadIdx.x >> 2, c = threadIdx.x & 3;
                const i64 s = sl[r];
                const char* src = (const char*)(cache + (s < 0 ? 0 : s) * MLA_W) + 16 * c;
                const unsigned dst = base + r * MLA_ROW * 2 + 16 * c;
                const int bytes = s < 0 ? 0 : 16;
#pragma unroll
                for (int k = 0; k < MLA_CHUNKS / 4; k++) mla_cp16(dst + 64 * k, src + 64 * k, bytes);
            }
            mla_commit();
        }
    }

    // Tile `tile` (the oldest in flight) has landed.
    __device__ __forceinline__ void wait(int tile) const {
        if constexpr (BULK) {
            mla_bar_wait(bars + 8 * (tile % STAGES), (tile / STAGES) & 1);
        } else {
            mla_wait<STAGES - 2>();
        }
    }

    __device__ __forceinline__ void drain() const {
        if constexpr (!BULK) mla_wait<0>();
    }
};

// O[MT m-tiles][8 n-tiles] += P · V for this warp's 64 columns; P [16*MT][PROW] bf16.
template <int MT>
__device__ __forceinline__ void mla_pv(float (*o)[8][4], unsigned p_s, unsigned tile) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned p_lane = p_s + ((lane & 15) * MLA_PROW + (lane >> 4) * 8) * 2;
    const unsigned v_lane = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * MLA_ROW * 2 +
                            (64 * warp + (lane >> 4) * 8) * 2;
#pragma unroll
    for (int kk = 0; kk < MLA_BN / 16; kk++) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) mla_ldsm4(a[mt], p_lane + (mt * 16 * MLA_PROW + kk * 16) * 2);
#pragma unroll
        for (int np = 0; np < 4; np++) {
            unsigned b[4];
            mla_ldsm4t(b, v_lane + (kk * 16 * MLA_ROW + np * 16) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mla_mma(o[mt][2 * np], a[mt], b[0], b[1]);
                mla_mma(o[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// part = O / l for this warp's 64 columns of row `row` (fragment half hh of m-tile o_mt).
__device__ __forceinline__ void mla_store_row(float* part, const float (*o_mt)[4], int hh,
                                              i64 base, float l) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float* dst = part + base * MLA_L + 64 * warp + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < 8; j++)
        *(float2*)(dst + 8 * j) = make_float2(o_mt[j][2 * hh] * inv, o_mt[j][2 * hh + 1] * inv);
}

template <int MT, int STAGES, bool QREG, bool BULK>
__device__ __forceinline__ void mla_decode_body(const float* q_lat, const float* q,
                                                const bf16* cache, float* part, float* lse,
                                                const int* n_keys, const int* sel_off,
                                                const int* sel_pos, const int* block_tables,
                                                const int* bt_off, int bs, int nh, int p_dim,
                                                int ns, float scale_log2) {
    constexpr int ROWS = 16 * MT;
    constexpr int NACC = 4 / MT;  // independent S accumulators per m-tile (mma latency)
    extern __shared__ __align__(16) unsigned char mla_sm[];
    bf16* q_s = (bf16*)(mla_sm + STAGES * MLA_TILE_BYTES);  // [ROWS][ROW] (not with QREG)
    bf16* p_s = q_s + (QREG ? 0 : ROWS * MLA_ROW);          // [ROWS][PROW]
    float* red = (float*)(p_s + ROWS * MLA_PROW);           // [WARPS][ROWS]
    i64* slots = (i64*)(red + MLA_WARPS * ROWS);            // [STAGES][BN]
    const unsigned kv = mla_smem(mla_sm);
    const MlaLoader<STAGES, BULK> ld{slots, kv, mla_smem(slots + STAGES * MLA_BN)};
    ld.init();

    const MlaWork wk = mla_work(ROWS, nh, ns, n_keys, sel_off, block_tables, bt_off);
    const int t = wk.t, h0 = wk.h0;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;

    // Queries as bf16 rows in shared memory: q_s, or, with QREG, the last stage's buffer
    // (first written by the copy of tile STAGES-1, after the loop's first barrier), from
    // where each warp loads its A fragments of every k-step into registers.
    bf16* q_rows = QREG ? (bf16*)(mla_sm + (STAGES - 1) * MLA_TILE_BYTES) : q_s;
    mla_stage_q(q_rows, ROWS, q_lat, q, t, h0, nh, p_dim);
    unsigned qf[QREG ? MLA_KSTEPS : 1][4];

    float o[MT][8][4];
    float m_r[MT][2], l_r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][j][e] = 0.f;
        m_r[mt][0] = m_r[mt][1] = -INFINITY;
        l_r[mt][0] = l_r[mt][1] = 0.f;
    }

    for (int j = 0; j < STAGES - 1; j++)
        if (j < wk.ntiles) ld.fill(wk, j, sel_pos, bs);
    MlaSlotPipe pipe;
    pipe.start(wk, sel_pos, bs, STAGES - 1);
    __syncthreads();  // slots, barriers and Q rows visible
    for (int j = 0; j < STAGES - 1; j++) ld.issue(wk, j, cache);

    const unsigned k_lane = ((8 * warp + (lane & 7)) * MLA_ROW + (lane >> 3) * 8) * 2;
    const unsigned q_lane = mla_smem(q_rows) + ((lane & 15) * MLA_ROW + (lane >> 4) * 8) * 2;
    if constexpr (QREG) {
#pragma unroll
        for (int ks = 0; ks < MLA_KSTEPS; ks++) mla_ldsm4(qf[ks], q_lane + ks * 32);
    }

    for (int i = 0; i < wk.ntiles; i++) {
        if (i + STAGES - 1 < wk.ntiles)
            pipe.step(slots + ((i + STAGES - 1) % STAGES) * MLA_BN, wk, sel_pos, bs, i + STAGES - 1);
        ld.wait(i);
        __syncthreads();  // tile i landed for all; tile i-1's stage, P and red are free
        ld.issue(wk, i + STAGES - 1, cache);

        const int cnt = min(MLA_BN, wk.k1 - (wk.k0 + i * MLA_BN));
        const unsigned tile = kv + (i % STAGES) * MLA_TILE_BYTES;

        // S = Q·K^T for this warp's 8 keys.
        float sacc[MT][NACC][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int a = 0; a < NACC; a++)
#pragma unroll
                for (int e = 0; e < 4; e++) sacc[mt][a][e] = 0.f;
#pragma unroll
        for (int kp = 0; kp < MLA_KSTEPS / 2; kp++) {
            unsigned b[4];
            mla_ldsm4(b, tile + k_lane + kp * 64);
#pragma unroll
            for (int hs = 0; hs < 2; hs++) {
                const int ks = 2 * kp + hs;
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (QREG) {
                        mla_mma(sacc[mt][ks % NACC], qf[ks], b[2 * hs], b[2 * hs + 1]);
                    } else {
                        unsigned a[4];
                        mla_ldsm4(a, q_lane + (mt * 16 * MLA_ROW + ks * 16) * 2);
                        mla_mma(sacc[mt][ks % NACC], a, b[2 * hs], b[2 * hs + 1]);
                    }
                }
            }
        }
        float s[MT][4];
        const int key = 8 * warp + 2 * tig;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = 0.f;
#pragma unroll
                for (int a = 0; a < NACC; a++) x += sacc[mt][a][e];
                s[mt][e] = (key + (e & 1) < cnt) ? x * scale_log2 : -INFINITY;
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                float mx = fmaxf(s[mt][2 * hh], s[mt][2 * hh + 1]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                if (tig == 0) red[warp * ROWS + mt * 16 + g + 8 * hh] = mx;
            }
        }
        __syncthreads();  // every warp's row maxima

        // Online softmax: new row max over the 64 keys, rescale O, P to shared memory.
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = mt * 16 + g + 8 * hh;
                float mx = m_r[mt][hh];
#pragma unroll
                for (int w = 0; w < MLA_WARPS; w++) mx = fmaxf(mx, red[w * ROWS + row]);
                const float alpha = mla_exp2(m_r[mt][hh] - mx);  // 0 while m was -inf
                m_r[mt][hh] = mx;
                const float p0 = mla_exp2(s[mt][2 * hh] - mx), p1 = mla_exp2(s[mt][2 * hh + 1] - mx);
                l_r[mt][hh] = l_r[mt][hh] * alpha + p0 + p1;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    o[mt][j][2 * hh] *= alpha;
                    o[mt][j][2 * hh + 1] *= alpha;
                }
                *(unsigned*)(p_s + row * MLA_PROW + key) = mla_pack(p0, p1);
            }
        }
        __syncthreads();  // P complete

        mla_pv<MT>(o, mla_smem(p_s), tile);
    }
    ld.drain();

    // Row sums: the quad's lanes, then the 8 warps (every thread has passed the last
    // reader of `red`: the barrier before P·V).
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float l = l_r[mt][hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (tig == 0) red[warp * ROWS + mt * 16 + g + 8 * hh] = l;
        }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int row = mt * 16 + g + 8 * hh, h = h0 + row;
            float l = 0.f;
#pragma unroll
            for (int w = 0; w < MLA_WARPS; w++) l += red[w * ROWS + row];
            if (h >= nh) continue;
            const i64 base = ((i64)t * nh + h) * ns + wk.sp;
            mla_store_row(part, o[mt], hh, base, l);
            if (warp == 0 && tig == 0)
                lse[base] = l > 0.f ? m_r[mt][hh] * 0.69314718056f + __logf(l) : -INFINITY;
        }
}

// 32 heads, S split over features (see the file comment). 2 stages.
template <bool BULK>
__device__ __forceinline__ void mla_decode_ksplit(const float* q_lat, const float* q,
                                                  const bf16* cache, float* part, float* lse,
                                                  const int* n_keys, const int* sel_off,
                                                  const int* sel_pos, const int* block_tables,
                                                  const int* bt_off, int bs, int nh, int p_dim,
                                                  int ns, float scale_log2) {
    constexpr int STAGES = 2, ROWS = 32, KQ = MLA_KSTEPS / 4;  // 9 k-steps per warp
    extern __shared__ __align__(16) unsigned char mla_sm[];
    float* s_part = (float*)(mla_sm + STAGES * MLA_TILE_BYTES);  // [4][ROWS][SROW]
    bf16* p_s = (bf16*)(s_part + 4 * ROWS * MLA_SROW);           // [ROWS][PROW]
    float* row_s = (float*)(p_s + ROWS * MLA_PROW);              // [ROWS]: alpha, then l
    i64* slots = (i64*)(row_s + ROWS);                           // [STAGES][BN]
    const unsigned kv = mla_smem(mla_sm);
    const MlaLoader<STAGES, BULK> ld{slots, kv, mla_smem(slots + STAGES * MLA_BN)};
    ld.init();

    const MlaWork wk = mla_work(ROWS, nh, ns, n_keys, sel_off, block_tables, bt_off);
    const int t = wk.t, h0 = wk.h0;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int kq = warp & 3, kn = warp >> 2;      // S: feature quarter, 32-key half
    const int srow = tid >> 3, sc = tid & 7;      // softmax: row, 4+4 keys

    // Q: the A fragments of this warp's feature quarter, straight from global memory (staging
    // the rows through shared memory first, as the m1 bodies do, measured 3% slower here).
    unsigned qf[2][KQ][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int ks = 0; ks < KQ; ks++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int h = h0 + mt * 16 + g + 8 * (j & 1);
                int c = (kq * KQ + ks) * 16 + 2 * tig + 8 * (j >> 1);
                qf[mt][ks][j] = mla_pack(mla_q(q_lat, q, t, h, c, nh, p_dim),
                                         mla_q(q_lat, q, t, h, c + 1, nh, p_dim));
            }

    float o[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][j][e] = 0.f;
    float m_row = -INFINITY, l_row = 0.f;  // of row srow, same in its 8 threads

    if (0 < wk.ntiles) ld.fill(wk, 0, sel_pos, bs);
    MlaSlotPipe pipe;
    pipe.start(wk, sel_pos, bs, 1);
    __syncthreads();  // slots and barriers visible
    ld.issue(wk, 0, cache);

    // ldmatrix.x4 of two n-tiles' B fragments: lanes 0-15 keys of n-tile 2np, 16-31 of 2np+1.
    const unsigned k_lane =
        ((32 * kn + 8 * (lane >> 4) + (lane & 7)) * MLA_ROW + ((lane >> 3) & 1) * 8) * 2;

    for (int i = 0; i < wk.ntiles; i++) {
        if (i + 1 < wk.ntiles) pipe.step(slots + ((i + 1) % STAGES) * MLA_BN, wk, sel_pos, bs, i + 1);
        ld.wait(i);
        __syncthreads();  // tile i landed; tile i-1's stage, P, partials and row_s are free
        ld.issue(wk, i + 1, cache);

        const int cnt = min(MLA_BN, wk.k1 - (wk.k0 + i * MLA_BN));
        const unsigned tile = kv + (i % STAGES) * MLA_TILE_BYTES;

        // Partial S over this warp's 144 features, keys 32kn..32kn+31, all 32 heads.
        float sacc[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) sacc[mt][n][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KQ; ks++) {
            const int col = (kq * KQ + ks) * 16;
#pragma unroll
            for (int np = 0; np < 2; np++) {
                unsigned b[4];
                mla_ldsm4(b, tile + k_lane + (np * 16 * MLA_ROW + col) * 2);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mla_mma(sacc[mt][2 * np], qf[mt][ks], b[0], b[1]);
                    mla_mma(sacc[mt][2 * np + 1], qf[mt][ks], b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int n = 0; n < 4; n++) {
                float* dst = s_part + (kq * ROWS + mt * 16 + g) * MLA_SROW + 32 * kn + 8 * n + 2 * tig;
                *(float2*)dst = make_float2(sacc[mt][n][0], sacc[mt][n][1]);
                *(float2*)(dst + 8 * MLA_SROW) = make_float2(sacc[mt][n][2], sacc[mt][n][3]);
            }
        __syncthreads();  // partials complete

        // Softmax of row srow, keys 4sc..4sc+3 and 32+4sc..32+4sc+3.
        float x[8];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float4 v = *(const float4*)(s_part + (k * ROWS + srow) * MLA_SROW + 32 * hf + 4 * sc);
                acc.x += v.x;
                acc.y += v.y;
                acc.z += v.z;
                acc.w += v.w;
            }
            const int k0 = 32 * hf + 4 * sc;
            x[4 * hf + 0] = k0 + 0 < cnt ? acc.x * scale_log2 : -INFINITY;
            x[4 * hf + 1] = k0 + 1 < cnt ? acc.y * scale_log2 : -INFINITY;
            x[4 * hf + 2] = k0 + 2 < cnt ? acc.z * scale_log2 : -INFINITY;
            x[4 * hf + 3] = k0 + 3 < cnt ? acc.w * scale_log2 : -INFINITY;
        }
        float mx = x[0];
#pragma unroll
        for (int e = 1; e < 8; e++) mx = fmaxf(mx, x[e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, m_row);
        const float alpha = mla_exp2(m_row - mx);  // 0 while m was -inf
        m_row = mx;
        float p[8], psum = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            p[e] = mla_exp2(x[e] - mx);
            psum += p[e];
        }
        l_row = l_row * alpha + psum;
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            *(uint2*)(p_s + srow * MLA_PROW + 32 * hf + 4 * sc) =
                make_uint2(mla_pack(p[4 * hf], p[4 * hf + 1]), mla_pack(p[4 * hf + 2], p[4 * hf + 3]));
        if (sc == 0) row_s[srow] = alpha;
        __syncthreads();  // P and alpha complete

#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const float a = row_s[mt * 16 + g + 8 * hh];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    o[mt][j][2 * hh] *= a;
                    o[mt][j][2 * hh + 1] *= a;
                }
            }
        mla_pv<2>(o, mla_smem(p_s), tile);
    }
    ld.drain();

    // Row sums over the row's 8 threads; row_s is free once every thread passed the barrier
    // below (the last readers of alpha read it before their P·V).
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 1);
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 4);
    __syncthreads();
    if (sc == 0) {
        row_s[srow] = l_row;
        const int h = h0 + srow;
        if (h < nh)
            lse[((i64)t * nh + h) * ns + wk.sp] =
                l_row > 0.f ? m_row * 0.69314718056f + __logf(l_row) : -INFINITY;
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int row = mt * 16 + g + 8 * hh, h = h0 + row;
            if (h >= nh) continue;
            mla_store_row(part, o[mt], hh, ((i64)t * nh + h) * ns + wk.sp, row_s[row]);
        }
}

#endif  // MLA_TC

// `early` (read by mla_decode_w64 only): 1, the key lists, block tables and cache rows were
// all written before the previous grid began (the fused small-step path: kv_finish, then
// mla_q_absorb, then this kernel), so the first key tile may be fetched before the wait; 2,
// the same but for token t's new row, cache row new_slots[t], which the previous grid writes
// (mla_q_absorb with kv_finish fused) and the kernel copies after the wait.
#define MLA_PARAMS                                                                             \
    const float *q_lat, const float *q, const bf16 *cache, float *part, float *lse,           \
        const int *n_keys, const int *sel_off, const int *sel_pos, const int *block_tables,   \
        const int *bt_off, int bs, int nh, int p_dim, int ns, float scale_log2, int early,    \
        const i64 *new_slots
#define MLA_ARGS                                                                               \
    q_lat, q, cache, part, lse, n_keys, sel_off, sel_pos, block_tables, bt_off, bs, nh, p_dim, \
        ns, scale_log2

#ifdef MLA_TC
#define MLA_CALL(BODY) BODY(MLA_ARGS);
#else
#define MLA_CALL(BODY) __trap();
#endif
#if defined(MLA_TC) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define MLA_CALL90(BODY) BODY(MLA_ARGS);
#else
#define MLA_CALL90(BODY) __trap();
#endif

extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_m1s3q(MLA_PARAMS) {
    MLA_PDL();
    MLA_CALL((mla_decode_body<1, 3, true, false>))
}
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_m2s2(MLA_PARAMS) {
    MLA_PDL();
    MLA_CALL((mla_decode_body<2, 2, false, false>))
}
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_m1s2(MLA_PARAMS) {
    MLA_PDL();
    MLA_CALL((mla_decode_body<1, 2, false, false>))
}
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_m2k(MLA_PARAMS) {
    MLA_PDL();
    MLA_CALL(mla_decode_ksplit<false>)
}
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_m1s3b(MLA_PARAMS) {
    MLA_PDL();
    MLA_CALL90((mla_decode_body<1, 3, true, true>))
}
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_m2kb(MLA_PARAMS) {
    MLA_PDL();
    MLA_CALL90(mla_decode_ksplit<true>)
}
