// Absorbed MLA decode on sm_90a warpgroup MMA (wgmma): the contract of mla_decode.cu's kernels
// (attn_mqa_split's outputs, then attn_mqa_combine) for 64 heads a block.
//
// A block is (token, group of 64 heads, split of the key list): two warpgroups, 256 threads,
// one block per SM. Shared memory, from a 1024-byte-aligned base, every matrix in the 128-byte
// swizzled layout wgmma reads (row r of a 64-column atom at r*128, its 16-byte chunk c at
// (c ^ (r % 8)) * 16; atoms of 64 rows x 128 bytes = 8 KB):
//   Q     [64 heads][576] bf16, 9 atoms (72 KB), written once from the f32 queries;
//   K/V   2 stages of [64 keys][576] bf16, 9 atoms each (2 x 72 KB), cp.async 16 bytes a
//         thread, rows past the split zero-filled;
//   P     [64 heads][64 keys] bf16, 1 atom (8 KB);
//   slots [2][64] i64, row maxima / sums [2 warpgroups][64] f32.
// Per tile: warpgroup g computes S[:, 32g..32g+31] = Q·K^T (36 x m64n32k16, A = Q, B = the
// tile's rows K-major), scales and masks it, and the two exchange row maxima through shared
// memory; each writes its half of P = exp2(S - m) as bf16, rescales its O and computes
// O[:, 256g..256g+255] += P·V (4 x m64n256k16, A = P, B = the same tile's first 512 columns,
// N-major: LBO = 8 KB between 64-column atoms, SBO = 1 KB between 8-key groups). O is 128
// f32 registers a thread. Numerics as mla_decode.cu: bf16 q, cache and P; f32 scores, softmax,
// sums and accumulators; part [T, N, NS, 512] normalized per split, lse [T, N, NS] natural log.
// Heads past N in the last group run on zero queries and are never written.
// Only sm_90a has wgmma: elsewhere the kernel traps, and the host never launches it there.

#define MLW_ATOM 8192                      // 64 rows x 128 bytes
#define MLW_TILE (9 * MLW_ATOM)            // 64 rows x 576 bf16
#define MLW_SMEM (3 * MLW_TILE + MLW_ATOM + 2 * 64 * 8 + 2 * 64 * 4 + 1024)  // + alignment slack

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

// d[16] (+)= A·B, m64n32k16, bf16 operands from shared memory (descriptors), f32
// accumulators; B K-major. acc = 0 overwrites d.
__device__ __forceinline__ void mlw_mma_n32(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}

// d[128] (+)= A·B, m64n256k16, bf16 operands from shared memory (descriptors), f32
// accumulators; B N-major (transposed). acc = 0 overwrites d.
__device__ __forceinline__ void mlw_mma_n256t(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}

// Slots of tile `tile` into slots[tile % 2] (threads 0..63).
__device__ __forceinline__ void mlw_fill(i64* slots, const MlaWork& w, int tile, const int* sel_pos,
                                         int bs) {
    if (threadIdx.x < 64) {
        const int kk = w.k0 + tile * 64 + threadIdx.x;
        i64 s = -1;
        if (kk < w.k1) {
            const int pos = w.so < 0 ? kk : sel_pos[w.so + kk];
            s = (i64)w.bt[pos / bs] * bs + pos % bs;
        }
        slots[(tile % 2) * 64 + threadIdx.x] = s;
    }
}

// Starts the copy of tile `tile` into stage tile % 2 if it exists; one cp.async group always.
__device__ __forceinline__ void mlw_issue(const i64* slots, unsigned kv, const MlaWork& w, int tile,
                                          const bf16* cache) {
    if (tile < w.ntiles) {
        const i64* sl = slots + (tile % 2) * 64;
        const unsigned stage = kv + (tile % 2) * MLW_TILE;
        for (int c = threadIdx.x; c < 64 * MLA_CHUNKS; c += MLA_THREADS) {
            const int r = c / MLA_CHUNKS, col = c - r * MLA_CHUNKS;
            const i64 s = sl[r];
            const bf16* src = cache + (s < 0 ? 0 : s) * MLA_W + col * 8;
            mla_cp16(stage + (col >> 3) * MLW_ATOM + mlw_swz(r, col & 7), src, s < 0 ? 0 : 16);
        }
    }
    mla_commit();
}

__device__ __forceinline__ void mlw_body(const float* q_lat, const float* q, const bf16* cache,
                                         float* part, float* lse, const int* n_keys,
                                         const int* sel_off, const int* sel_pos,
                                         const int* block_tables, const int* bt_off, int bs,
                                         int nh, int p_dim, int ns, float scale_log2) {
    extern __shared__ __align__(1024) unsigned char mlw_raw[];
    const unsigned raw = mla_smem(mlw_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* gen = mlw_raw + (base - raw);
    const unsigned q_s = base, kv = base + MLW_TILE, p_s = base + 3 * MLW_TILE;
    i64* slots = (i64*)(gen + 3 * MLW_TILE + MLW_ATOM);  // [2][64]
    float* red = (float*)(slots + 2 * 64);               // [2][64]

    const MlaWork wk = mla_work(64, nh, ns, n_keys, sel_off, block_tables, bt_off);
    const int t = wk.t, h0 = wk.h0;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
    const int r0 = 16 * wq + (lane >> 2), r1 = r0 + 8, qd = lane & 3;

    // Q rows as bf16 in the swizzled layout: thread per 16-byte chunk (8 columns), coalesced.
    for (int i = tid; i < 64 * MLA_CHUNKS; i += MLA_THREADS) {
        const int r = i / MLA_CHUNKS, c = i - r * MLA_CHUNKS;
        unsigned w[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            w[e] = mla_pack(mla_q(q_lat, q, t, h0 + r, 8 * c + 2 * e, nh, p_dim),
                            mla_q(q_lat, q, t, h0 + r, 8 * c + 2 * e + 1, nh, p_dim));
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(q_s + (c >> 3) * MLW_ATOM +
                                                                     mlw_swz(r, c & 7)),
                     "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                     : "memory");
    }

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows r0, r1; l over own keys

    if (0 < wk.ntiles) mlw_fill(slots, wk, 0, sel_pos, bs);
    __syncthreads();  // slots of tile 0
    mlw_issue(slots, kv, wk, 0, cache);

    for (int i = 0; i < wk.ntiles; i++) {
        if (i + 1 < wk.ntiles) mlw_fill(slots, wk, i + 1, sel_pos, bs);
        mla_wait<0>();
        mlw_proxy_fence();
        __syncthreads();  // tile i (and Q) landed for all; P·V of tile i-1 done everywhere
        mlw_issue(slots, kv, wk, i + 1, cache);

        const unsigned tile = kv + (i % 2) * MLW_TILE;
        const int cnt = min(64, wk.k1 - (wk.k0 + i * 64));

        // S[:, 32wg..32wg+31] over 36 k-steps of 16 columns (4 per atom, 32 bytes apart).
        float s[16];
        mlw_fence();
#pragma unroll
        for (int ks = 0; ks < MLA_KSTEPS; ks++) {
            const unsigned off = (ks >> 2) * MLW_ATOM + (ks & 3) * 32;
            mlw_mma_n32(s, mlw_desc(q_s + off, 16, 1024),
                        mlw_desc(tile + off + wg * 32 * 128, 16, 1024), ks > 0);
        }
        mlw_commit();
        mlw_wait0();
        mlw_pin<16>(s);

        // s[4j + e]: row r0 (e < 2) or r1, key 32wg + 8j + 2qd + (e & 1).
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = 32 * wg + 8 * j + 2 * qd + (e & 1);
                const float x = key < cnt ? s[4 * j + e] * scale_log2 : -INFINITY;
                s[4 * j + e] = x;
                if (e < 2) mx0 = fmaxf(mx0, x);
                else mx1 = fmaxf(mx1, x);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        if (qd == 0) {
            red[wg * 64 + r0] = mx0;
            red[wg * 64 + r1] = mx1;
        }
        __syncthreads();  // both halves' row maxima
        const float n0 = fmaxf(m0, fmaxf(mx0, red[(1 - wg) * 64 + r0]));
        const float n1 = fmaxf(m1, fmaxf(mx1, red[(1 - wg) * 64 + r1]));
        const float a0 = mla_exp2(m0 - n0), a1 = mla_exp2(m1 - n1);  // 0 while m was -inf
        m0 = n0;
        m1 = n1;
        float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float p0 = mla_exp2(s[4 * j] - n0), p1 = mla_exp2(s[4 * j + 1] - n0);
            const float p2 = mla_exp2(s[4 * j + 2] - n1), p3 = mla_exp2(s[4 * j + 3] - n1);
            ps0 += p0 + p1;
            ps1 += p2 + p3;
            const int chunk = 4 * wg + j;
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p_s + mlw_swz(r0, chunk) + 4 * qd),
                         "r"(mla_pack(p0, p1))
                         : "memory");
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p_s + mlw_swz(r1, chunk) + 4 * qd),
                         "r"(mla_pack(p2, p3))
                         : "memory");
        }
        l0 = l0 * a0 + ps0;
        l1 = l1 * a1 + ps1;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            o[4 * j] *= a0;
            o[4 * j + 1] *= a0;
            o[4 * j + 2] *= a1;
            o[4 * j + 3] *= a1;
        }
        mlw_proxy_fence();
        __syncthreads();  // P complete

        // O[:, 256wg..] += P·V: 4 k-steps of 16 keys (2 KB apart), B from atoms 4wg..4wg+3.
        mlw_pin<128>(o);
        mlw_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            mlw_mma_n256t(o, mlw_desc(p_s + kk * 32, 16, 1024),
                          mlw_desc(tile + 4 * wg * MLW_ATOM + kk * 16 * 128, MLW_ATOM, 1024), 1);
        mlw_commit();
        mlw_wait0();
        mlw_pin<128>(o);
    }
    mla_wait<0>();

    // Row sums: the quad, then the two warpgroups (every reader of `red` passed the barrier
    // before the last P·V, or there was no tile).
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (qd == 0) {
        red[wg * 64 + r0] = l0;
        red[wg * 64 + r1] = l1;
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int row = hh ? r1 : r0, h = h0 + row;
        if (h >= nh) continue;
        const float l = red[row] + red[64 + row], m = hh ? m1 : m0;
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

extern "C" __global__ void __launch_bounds__(MLA_THREADS, 1) mla_decode_w64(MLA_PARAMS) {
#ifdef MLW_OK
    mlw_body(MLA_ARGS);
#else
    __trap();
#endif
}
