// Absorbed MLA decode on sm_90a warpgroup MMA (wgmma): the contract of mla_decode.cu's kernels
// (attn_mqa_split's outputs, then attn_mqa_combine) for 64 heads a block. Measured: 411-423
// TFLOP/s at 128 heads, 84-102% of the copy ceiling at 16 (bench/cuda/mla_decode.md).
//
// A block is (token, group of 64 heads, split of the key list): two warpgroups, 256 threads,
// one block per SM. Shared memory, from a 1024-byte-aligned base, every matrix in the 128-byte
// swizzled layout wgmma reads (row r of a 64-column atom at r*128, its 16-byte chunk c at
// (c ^ (r % 8)) * 16; atoms of 64 rows x 128 bytes = 8 KB):
//   Q     [64 heads][576] bf16, 9 atoms (72 KB), written once from the f32 queries;
//   K/V   2 stages of [64 keys][576] bf16, 9 atoms each (2 x 72 KB), cp.async 16 bytes a
//         thread, rows past the split zero-filled;
//   P     [64 heads][64 keys] bf16, 1 atom (8 KB);
//   slots [2][64] i64, rescale factors / row sums [64] f32 (+ 256 bytes unused).
// Per tile, after a barrier: warpgroup 0 issues S = Q·K^T (36 x m64n64k16, A = Q, B = the
// tile's rows K-major) and every thread then issues its share of the next tile's copies (so the
// tensor core starts at once); warpgroup 0 waits for S, masks it, takes the softmax (online,
// exp2, the scale folded into the exponent's FFMA) and writes P = exp2(S * scale - m) as bf16
// and each row's rescale factor to shared memory; after a barrier both warpgroups rescale their
// O and compute
// O[:, 256g..256g+255] += P·V (4 x m64n256k16, A = P, B = the same tile's first 512 columns,
// N-major: LBO = 8 KB between 64-column atoms, SBO = 1 KB between 8-key groups). O is 128
// f32 registers a thread. (Splitting S over the two warpgroups, m64n32 each with the row
// maxima exchanged, measured 5-10% slower: bench/cuda/mla_decode.md.) Numerics as
// mla_decode.cu: bf16 q, cache and P; f32 scores, softmax, sums and accumulators; part
// [T, N, NS, 512] normalized per split, lse [T, N, NS] natural log. Heads past N in the last
// group run on zero queries and are never written.
// Only sm_90a has wgmma: elsewhere the kernel traps, and the host never launches it there.

#define MLW_ATOM 8192                      // 64 rows x 128 bytes
#define MLW_TILE (9 * MLW_ATOM)            // 64 rows x 576 bf16
// The block's shared memory size (this layout + 1 KB of alignment slack): MlaVariant::smem_bytes.

#if defined(MLA_TC) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLW_OK 1

// Byte offset of (row, 16-byte chunk) inside a 128-byte-swizzled atom.
__device__ __forceinline__ unsigned mlw_swz(int row, int chunk) {
    return row * 128 + ((chunk ^ (row & 7)) << 4);
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ unsigned long long mlw_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void mlw_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mlw_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mlw_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void mlw_proxy_fence() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across wgmma issue/wait.
template <int N>
__device__ __forceinline__ void mlw_pin(float* d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// Operand lists of the wgmma wrappers (here and in flash_attn_wgmma.cu): the accumulators
// d[0..N) as "+f" operands 0..N-1, and their placeholders in the instruction text.
#define MLW_P32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MLW_P64 MLW_P32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
                "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "  \
                "%60, %61, %62, %63"
#define MLW_P128 MLW_P64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, " \
                 "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, " \
                 "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, " \
                 "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, "    \
                 "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MLW_D8(d, i)                                                                             \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define MLW_D32(d, i) MLW_D8(d, i), MLW_D8(d, i + 8), MLW_D8(d, i + 16), MLW_D8(d, i + 24)
#define MLW_D64(d) MLW_D32(d, 0), MLW_D32(d, 32)
#define MLW_D128(d) MLW_D32(d, 0), MLW_D32(d, 32), MLW_D32(d, 64), MLW_D32(d, 96)

// d[32] (+)= A·B, m64n64k16, bf16 operands from shared memory (descriptors), f32
// accumulators; B K-major. acc = 0 overwrites d.
__device__ __forceinline__ void mlw_mma_n64(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MLW_P32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : MLW_D32(d, 0)
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}

// d[128] (+)= A·B, m64n256k16, bf16 operands from shared memory (descriptors), f32
// accumulators; B N-major (transposed). acc = 0 overwrites d.
__device__ __forceinline__ void mlw_mma_n256t(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLW_P128 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : MLW_D128(d)
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}

// Starts the copy of tile `tile` into stage tile % 2 if it exists; one cp.async group always.
// Thread t copies row t/4 (one slot read): 16-byte chunks t%4 + 4k, k < 18, i.e. chunks t%4
// and t%4 + 4 of each atom, at constant offsets from two per-thread bases (a warp reads 64
// contiguous bytes of each of 8 rows an instruction).
// With `defer` >= 0 only some rows: those of other slots than `defer` (`deferred` false), or
// that slot's alone (true); each row is a thread's (four threads a row, all of its chunks).
__device__ __forceinline__ void mlw_issue(const i64* slots, unsigned kv, const MlaWork& w, int tile,
                                          const bf16* cache, i64 defer = -2,
                                          bool deferred = false) {
    const int r = threadIdx.x >> 2, c = threadIdx.x & 3;
    if (tile < w.ntiles && (defer < 0 || (slots[(tile % 2) * 64 + r] == defer) == deferred)) {
        const i64 s = slots[(tile % 2) * 64 + r];
        const char* src = (const char*)(cache + (s < 0 ? 0 : s) * MLA_W) + 16 * c;
        const unsigned dst = kv + (tile % 2) * MLW_TILE + r * 128;
        const unsigned d0 = dst + ((c ^ (r & 7)) << 4), d1 = dst + (((c + 4) ^ (r & 7)) << 4);
        const int bytes = s < 0 ? 0 : 16;
#pragma unroll
        for (int a = 0; a < 9; a++) {
            mla_cp16(d0 + a * MLW_ATOM, src + 128 * a, bytes);
            mla_cp16(d1 + a * MLW_ATOM, src + 128 * a + 64, bytes);
        }
    }
    mla_commit();
}

// Scores of a tile (warpgroup 0: all 64 keys, m64n64 over 36 k-steps), started here and
// finished by mlw_scores_finish, so that the tile copies are issued while they run.
// x[4j + e] is row r0 (e < 2) or r0 + 8, key 8j + 2qd + (e & 1).
template <int ABL>
__device__ __forceinline__ void mlw_scores_issue(float* x, unsigned q_s, unsigned tile) {
    if constexpr ((ABL & 4) == 0) {
        // A descriptor's low 14 bits are the address / 16, so a k-step moves both by a constant.
        const unsigned long long dq = mlw_desc(q_s, 16, 1024), dk = mlw_desc(tile, 16, 1024);
        mlw_fence();
#pragma unroll
        for (int ks = 0; ks < MLA_KSTEPS; ks++) {
            const unsigned off = ((ks >> 2) * MLW_ATOM + (ks & 3) * 32) >> 4;
            mlw_mma_n64(x, dq + off, dk + off, ks > 0);
        }
        mlw_commit();
    }
}

// Waits for the scores; keys past cnt at -inf (unscaled: the softmax folds the scale in).
template <int ABL>
__device__ __forceinline__ void mlw_scores_finish(float* x, int cnt, int qd) {
    if constexpr ((ABL & 4) != 0) {
#pragma unroll
        for (int e = 0; e < 32; e++) x[e] = 0.f;
    } else {
        mlw_wait0();
        mlw_pin<32>(x);
    }
    if (cnt < 64) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (8 * j + 2 * qd + (e & 1) >= cnt) x[4 * j + e] = -INFINITY;
    }
}

// Row maxima of x over this thread's quad (its two rows' 64 keys).
__device__ __forceinline__ void mlw_rowmax(const float* x, float& mx0, float& mx1) {
    mx0 = -INFINITY;
    mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        mx0 = fmaxf(mx0, fmaxf(x[4 * j], x[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(x[4 * j + 2], x[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// P = exp2(x * scale - m) as bf16 into the P atom (16-byte chunk j holds keys 8j..8j+7);
// returns the row sums of this thread's entries.
__device__ __forceinline__ void mlw_probs(const float* x, float scale, float n0, float n1,
                                          unsigned p_s, int r0, int qd, float& ps0, float& ps1) {
    ps0 = 0.f;
    ps1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float p0 = mla_exp2(fmaf(x[4 * j], scale, -n0)), p1 = mla_exp2(fmaf(x[4 * j + 1], scale, -n0));
        const float p2 = mla_exp2(fmaf(x[4 * j + 2], scale, -n1)), p3 = mla_exp2(fmaf(x[4 * j + 3], scale, -n1));
        ps0 += p0 + p1;
        ps1 += p2 + p3;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p_s + mlw_swz(r0, j) + 4 * qd),
                     "r"(mla_pack(p0, p1))
                     : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p_s + mlw_swz(r0 + 8, j) + 4 * qd),
                     "r"(mla_pack(p2, p3))
                     : "memory");
    }
}

// O *= the rows' rescale factors; skipped when the warp's are all 1 (the running maxima did
// not move: most tiles once the context is long).
__device__ __forceinline__ void mlw_rescale(float* o, float a0, float a1) {
    if (__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) return;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        o[4 * j] *= a0;
        o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1;
        o[4 * j + 3] *= a1;
    }
}

// Chunk i (16 bytes: 8 columns of one head's [q_lat | q_pe]) of a block's 64 query rows as f32,
// zeros past nh; two float4 loads where the rope part's rows are 16-byte aligned (P % 4 == 0).
__device__ __forceinline__ void mlw_q_chunk(float* x, const float* q_lat, const float* q, int t,
                                            int h0, int nh, int p_dim, int i) {
    const int r = i / MLA_CHUNKS, c = i - r * MLA_CHUNKS, h = h0 + r;
    if (h < nh && (c < MLA_L / 8 || (p_dim & 3) == 0)) {
        const float* src = c < MLA_L / 8
                               ? q_lat + ((i64)t * nh + h) * MLA_L + 8 * c
                               : q + ((i64)t * nh + h) * (p_dim + MLA_R) + p_dim + 8 * c - MLA_L;
        const float4 a = *(const float4*)src, b = *(const float4*)(src + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = mla_q(q_lat, q, t, h, 8 * c + e, nh, p_dim);
    }
}

__device__ __forceinline__ void mlw_q_store(unsigned q_s, const float* x, int i) {
    const int r = i / MLA_CHUNKS, c = i - r * MLA_CHUNKS;
    unsigned w[4];
#pragma unroll
    for (int e = 0; e < 4; e++) w[e] = mla_pack(x[2 * e], x[2 * e + 1]);
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(q_s + (c >> 3) * MLW_ATOM +
                                                                 mlw_swz(r, c & 7)),
                 "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
}

// The block's 64 query rows as bf16 in the swizzled layout, a thread per 16-byte chunk
// (coalesced). The stores are asm volatile, which a later chunk's loads cannot pass, so six
// chunks' loads are issued before their stores: 3 memory round trips a thread instead of 18
// (1-5% of the kernel at 4,096-8,192 keys, measured as lab variant W64QB in session 6).
__device__ __forceinline__ void mlw_stage_q(unsigned q_s, const float* q_lat, const float* q, int t,
                                            int h0, int nh, int p_dim) {
    constexpr int QN = 64 * MLA_CHUNKS / MLA_THREADS, QB = 6;
    static_assert(QN * MLA_THREADS == 64 * MLA_CHUNKS && QN % QB == 0, "Q chunks per thread");
    for (int g = 0; g < QN; g += QB) {
        float x[QB][8];
#pragma unroll
        for (int u = 0; u < QB; u++)
            mlw_q_chunk(x[u], q_lat, q, t, h0, nh, p_dim, threadIdx.x + (g + u) * MLA_THREADS);
#pragma unroll
        for (int u = 0; u < QB; u++) mlw_q_store(q_s, x[u], threadIdx.x + (g + u) * MLA_THREADS);
    }
}

// ABL (kernel lab only, outputs are not attention): bit 0 copies only the first two tiles and
// reuses them, bit 1 leaves out P·V, bit 2 leaves out S (scores of zero). Time differences
// between these and ABL = 0 place the time of a tile (bench/cuda/mla_decode.md).
// The block's shared-memory map (see the top of this file).
struct MlwSmem {
    unsigned q_s, kv, p_s;
    i64* slots;  // [2][64]
    float* red;  // [2][64]
};

__device__ __forceinline__ MlwSmem mlw_smem() {
    extern __shared__ __align__(1024) unsigned char mlw_raw[];
    const unsigned raw = mla_smem(mlw_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* gen = mlw_raw + (base - raw);
    MlwSmem m;
    m.q_s = base;
    m.kv = base + MLW_TILE;
    m.p_s = base + 3 * MLW_TILE;
    m.slots = (i64*)(gen + 3 * MLW_TILE + MLW_ATOM);
    m.red = (float*)(m.slots + 2 * 64);
    return m;
}

// The block's work, the slots of its first key tile and that tile's copy (a commit group),
// the row of slot `defer` left out where `defer` >= 0.
__device__ __forceinline__ void mlw_first_tile(const MlwSmem& sm, const MlaWork& wk,
                                               MlaSlotPipe& pipe, const int* sel_pos, int bs,
                                               const bf16* cache, i64 defer = -2) {
    if (0 < wk.ntiles) {
        pipe.start(wk, sel_pos, bs, 0);
        pipe.step(sm.slots, wk, sel_pos, bs, 0);
    }
    __syncthreads();  // slots of tile 0
    mlw_issue(sm.slots, sm.kv, wk, 0, cache, defer, false);
}

// What a block does before the wait on the previous grid: with `early`, its work and its
// first key tile's copy (inputs the previous grid does not write: MLA_PARAMS) — under early 2
// without the row of the token's new slot, which the previous grid writes and mlw_body copies
// after the wait (`defer`); else nothing.
struct MlwStart {
    MlaWork wk;
    MlaSlotPipe pipe;
    i64 defer;
};

__device__ __forceinline__ MlwStart mlw_start(const bf16* cache, const int* n_keys,
                                              const int* sel_off, const int* sel_pos,
                                              const int* block_tables, const int* bt_off, int bs,
                                              int nh, int ns, int early, const i64* new_slots) {
    MlwStart st = {};  // filled in by mlw_body where not early
    st.defer = -2;
    if (early) {
        st.wk = mla_work(64, nh, ns, n_keys, sel_off, block_tables, bt_off);
        if (early == 2) st.defer = new_slots[st.wk.t];
        mlw_first_tile(mlw_smem(), st.wk, st.pipe, sel_pos, bs, cache, st.defer);
    }
    return st;
}

template <int ABL>
__device__ __forceinline__ void mlw_body(MlwStart st, const float* q_lat, const float* q,
                                         const bf16* cache, float* part, float* lse,
                                         const int* n_keys, const int* sel_off,
                                         const int* sel_pos, const int* block_tables,
                                         const int* bt_off, int bs, int nh, int p_dim, int ns,
                                         float scale_log2, int early) {
    const MlwSmem sm = mlw_smem();
    const unsigned q_s = sm.q_s, kv = sm.kv, p_s = sm.p_s;
    i64* slots = sm.slots;
    float* red = sm.red;

    MlaSlotPipe pipe = st.pipe;
    if (!early) {
        st.wk = mla_work(64, nh, ns, n_keys, sel_off, block_tables, bt_off);
        mlw_first_tile(sm, st.wk, pipe, sel_pos, bs, cache);
    }
    const MlaWork wk = st.wk;
    // The new row left out before the wait (early 2), now written (tile 0's slots are still in
    // the first half of `slots`; the loop's first wait covers this commit group too).
    if (st.defer >= 0) mlw_issue(slots, kv, wk, 0, cache, st.defer, true);
    const int t = wk.t, h0 = wk.h0;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
    const int r0 = 16 * wq + (lane >> 2), r1 = r0 + 8, qd = lane & 3;

    mlw_stage_q(q_s, q_lat, q, t, h0, nh, p_dim);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    // Rows r0, r1: running max and, in warpgroup 0, the sum over this thread's keys.
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int i = 0; i < wk.ntiles; i++) {
        if (i + 1 < wk.ntiles) pipe.step(slots + ((i + 1) % 2) * 64, wk, sel_pos, bs, i + 1);
        mla_wait<0>();
        mlw_proxy_fence();
        __syncthreads();  // tile i (and Q) landed for all; P·V of tile i-1 done everywhere
        const unsigned tile = kv + (i % 2) * MLW_TILE;
        const int cnt = min(64, wk.k1 - (wk.k0 + i * 64));

        // Warpgroup 0: S (started before the next tile's copies are issued), the softmax, P
        // into shared memory, the rescale factors into `red`.
        float x[32];
        if (wg == 0) mlw_scores_issue<ABL>(x, q_s, tile);
        if (!(ABL & 1) || i == 0) mlw_issue(slots, kv, wk, i + 1, cache);
        if (wg == 0) {
            mlw_scores_finish<ABL>(x, cnt, qd);
            float mx0, mx1;
            mlw_rowmax(x, mx0, mx1);
            const float n0 = fmaxf(m0, mx0 * scale_log2), n1 = fmaxf(m1, mx1 * scale_log2);
            const float a0 = mla_exp2(m0 - n0), a1 = mla_exp2(m1 - n1);  // 0 while m was -inf
            m0 = n0;
            m1 = n1;
            float ps0, ps1;
            mlw_probs(x, scale_log2, n0, n1, p_s, r0, qd, ps0, ps1);
            l0 = l0 * a0 + ps0;
            l1 = l1 * a1 + ps1;
            if (qd == 0) {
                red[r0] = a0;
                red[r1] = a1;
            }
            mlw_rescale(o, a0, a1);
            mlw_proxy_fence();
        }
        __syncthreads();  // P and the rescale factors complete
        if (wg == 1) mlw_rescale(o, red[r0], red[r1]);

        // O[:, 256wg..] += P·V: 4 k-steps of 16 keys (2 KB apart), B from atoms 4wg..4wg+3.
        if constexpr ((ABL & 2) == 0) {
            const unsigned long long dp = mlw_desc(p_s, 16, 1024);
            const unsigned long long dv = mlw_desc(tile + 4 * wg * MLW_ATOM, MLW_ATOM, 1024);
            mlw_pin<128>(o);
            mlw_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) mlw_mma_n256t(o, dp + 2 * kk, dv + 128 * kk, 1);
            mlw_commit();
            mlw_wait0();
            mlw_pin<128>(o);
        }
    }
    mla_wait<0>();

    // Row sums (warpgroup 0's quads) to both warpgroups. `red` is free once every thread has
    // passed the barrier below (its last readers read it before their last P·V).
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    __syncthreads();
    if (wg == 0 && qd == 0) {
        red[r0] = l0;
        red[r1] = l1;
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int row = hh ? r1 : r0, h = h0 + row;
        if (h >= nh) continue;
        const float l = red[row], m = hh ? m1 : m0;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const i64 b = ((i64)t * nh + h) * ns + wk.sp;
        float* dst = part + b * MLA_L + 256 * wg + 2 * qd;
#pragma unroll
        for (int j = 0; j < 32; j++)
            *(float2*)(dst + 8 * j) = make_float2(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
        if (wg == 0 && qd == 0) lse[b] = l > 0.f ? m * 0.69314718056f + __logf(l) : -INFINITY;
    }
}
#endif  // MLW_OK

#ifdef MLW_OK
#define MLW_START(EARLY)                                                                     \
    const MlwStart st = mlw_start(cache, n_keys, sel_off, sel_pos, block_tables, bt_off, bs, \
                                  nh, ns, EARLY, new_slots);
#define MLW_CALL(ABL, EARLY) mlw_body<ABL>(st, MLA_ARGS, EARLY);
#else
#define MLW_START(EARLY)
#define MLW_CALL(ABL, EARLY) __trap();
#endif
// Inputs read before MLA_PDL() only under `early` (MLA_PARAMS), and never the queries.
extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_w64(MLA_PARAMS) {
    MLA_WEIGHTS_FIRST();
    MLW_START(early)
    MLA_PDL();
    MLW_CALL(0, early)
}
// Kernel-lab ablations of mla_decode_w64 (see mlw_body), never early.
#define MLW_ABLATION(NAME, ABL)                                                                 \
    extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) NAME(MLA_PARAMS) {            \
        MLA_PDL();                                                                             \
        MLW_START(0)                                                                           \
        MLW_CALL(ABL, 0)                                                                       \
    }
MLW_ABLATION(mla_decode_w64_noload, 1)  // compute only
MLW_ABLATION(mla_decode_w64_nopv, 2)    // loads, S, softmax
MLW_ABLATION(mla_decode_w64_nos, 4)     // loads, softmax, P·V
MLW_ABLATION(mla_decode_w64_s, 3)       // S and softmax
MLW_ABLATION(mla_decode_w64_pv, 5)      // softmax and P·V
MLW_ABLATION(mla_decode_w64_bare, 7)    // softmax, barriers and the rest
