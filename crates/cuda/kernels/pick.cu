// logits_pick: each logits row reduced to its token on the device — the argmax, a softmax
// draw by mlaserve_model::draw's integer weights, or a draw under top-k / top-p / min-p —
// bit for bit mlaserve_model::RowPick::of.
//
// A row is one group of blocks: one block (many rows), or at few rows a thread-block cluster
// of C blocks (sm_90; Gpu::logits_pick picks C), block `rank` taking the row's segment
// [lo, hi). Every pass runs over the block's segment; the group's sums, argmax, histograms
// and finds meet through distributed shared memory. Invariants of the cluster path:
// - The group's control flow depends only on exchanged values, identical in every block, so
//   every block takes the same branches and reaches the same cluster barriers, and no thread
//   leaves before the kernel's last barrier (a block's shared memory must outlive its readers).
// - Exchange slots alternate (two of each kind): a slot is written, the cluster barrier
//   releases it, it is read before the group's next barrier, and written again only after it.
// - Sums are integers (weights p * 2^40, truncated), so they are exact in any order: the
//   group's results are one block's results, whatever the split.

// ---- the values: argmax rules, probabilities and weights ----
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
// ---- the group: this block's rank, segment and exchanges ----
struct Grp {
    int rank, size, lo, hi;
    unsigned ops, hists;  // exchanges and histograms so far: their slots alternate
};
__device__ __forceinline__ Grp grp_of(int n) {
    Grp g;
    unsigned r = 0, s = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(s));
#endif
    int seg = (n + (int)s - 1) / (int)s;
    if ((n & 3) == 0) seg = (seg + 3) & ~3;  // float4-aligned segments
    g.rank = (int)r;
    g.size = (int)s;
    g.lo = min(n, (int)r * seg);
    g.hi = min(n, g.lo + seg);
    g.ops = g.hists = 0;
    return g;
}
// Every thread of every block of the cluster arrives (release) and waits (acquire).
__device__ __forceinline__ void grp_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// Block `rank`'s copy of this block's shared word at p.
__device__ __forceinline__ unsigned long long grp_ld64(const unsigned long long* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned a;
    unsigned long long v;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(mla_smem(p)), "r"(rank));
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(a) : "memory");
    return v;
#else
    return *p;
#endif
}
__device__ __forceinline__ unsigned grp_ld32(const unsigned* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned a, v;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(mla_smem(p)), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
    return v;
#else
    return *p;
#endif
}
// Exchange words: a block publishes up to 3 block-uniform words into slot ops % 2.
struct GrpWords {
    unsigned long long w[2][3];
};
// Publishes a, b, c (block-uniform) and returns the slot every block's words are in.
__device__ __forceinline__ int grp_publish(Grp& g, GrpWords* xw, unsigned long long a,
                                           unsigned long long b = 0, unsigned long long c = 0) {
    const int s = g.ops++ & 1;
    if (threadIdx.x == 0) {
        xw->w[s][0] = a;
        xw->w[s][1] = b;
        xw->w[s][2] = c;
    }
    grp_barrier();
    return s;
}
// The group's blocks' values v (block-uniform) in rank order: in every thread, the inclusive
// prefix through this lane's block (lanes < size) and the whole sum.
__device__ __forceinline__ unsigned long long grp_scan(Grp& g, GrpWords* xw, unsigned long long v,
                                                       unsigned long long& mine,
                                                       unsigned long long& total) {
    const int lane = threadIdx.x & 31;
    const int s = grp_publish(g, xw, v);
    mine = lane < g.size ? grp_ld64(&xw->w[s][0], lane) : 0ull;
    const unsigned long long incl = warp_incl_u64(mine, lane);
    total = __shfl_sync(0xffffffffu, incl, 31);
    return incl;
}
// The sum of v (block-uniform) over the group's blocks, in every thread.
__device__ __forceinline__ unsigned long long grp_sum(Grp& g, GrpWords* xw, unsigned long long v) {
    if (g.size == 1) return v;
    unsigned long long mine, total;
    grp_scan(g, xw, v, mine, total);
    return total;
}
// The block whose segment holds the first running sum above thr = thr_of(the group's sum of
// v, block-uniform), thr below that sum, and the sum of the blocks before it (base), in every
// thread.
template <class T>
__device__ __forceinline__ int grp_owner(Grp& g, GrpWords* xw, unsigned long long v, T thr_of,
                                         unsigned long long& thr, unsigned long long& base) {
    if (g.size == 1) {
        thr = thr_of(v);
        base = 0;
        return 0;
    }
    unsigned long long mine, total;
    const unsigned long long incl = grp_scan(g, xw, v, mine, total);
    thr = thr_of(total);
    const int lane = threadIdx.x & 31;
    const unsigned hit = __ballot_sync(0xffffffffu, lane < g.size && incl > thr);
    const int o = hit ? __ffs(hit) - 1 : g.size - 1;  // none only under the lab defines
    base = __shfl_sync(0xffffffffu, incl - mine, o);
    return o;
}

// ---- passes over the block's segment ----
// Calls f(i, row[i]) for this thread's share of i in [lo, hi) — float4 loads where n % 4 == 0
// (rows then 16-byte aligned, lo and hi multiples of 4) — in a loop whose trip count is the
// same in every thread (warp-converged: f may use warp intrinsics); v is false for the
// i >= hi a trip pads with.
template <class F>
__device__ __forceinline__ void row_trips(const float* row, int n, int lo, int hi, F f) {
    if ((n & 3) == 0) {
        for (int base = lo; base < hi; base += 4 * blockDim.x) {
            const int j = base + 4 * threadIdx.x;
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < hi) q = *reinterpret_cast<const float4*>(row + j);
            f(j, q.x, j < hi);
            f(j + 1, q.y, j < hi);
            f(j + 2, q.z, j < hi);
            f(j + 3, q.w, j < hi);
        }
    } else {
        for (int base = lo; base < hi; base += blockDim.x) {
            const int i = base + threadIdx.x;
            f(i, i < hi ? row[i] : 0.0f, i < hi);
        }
    }
}
// Sum of f(i, row[i]) over the block's segment, in every thread. red: 32 words of shared memory.
template <class F>
__device__ unsigned long long block_sum_u64(const float* row, int n, int lo, int hi, F f,
                                            unsigned long long* red) {
    unsigned long long s = 0;
    row_trips(row, n, lo, hi, [&](int i, float p, bool v) {
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
// Sum of f(i) over [lo, hi) by warp segments, in every thread; the warps' sums in red.
template <class F>
__device__ unsigned long long block_segments(int lo, int hi, F f, unsigned long long* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int sg = (hi - lo + nw * 32 - 1) / (nw * 32) * 32;
    const int wlo = min(hi, lo + warp * sg), whi = min(hi, wlo + sg);
    unsigned long long mine = 0;
    for (int j = wlo + lane; j < whi; j += 32) mine += f(j);
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    __syncthreads();
    if (lane == 0) red[warp] = mine;
    __syncthreads();
    unsigned long long t = 0;
    for (int w = 0; w < nw; ++w) t += red[w];
    return t;
}
// The first i in [lo, hi) whose running sum of f over lo..=i exceeds thr (the segment's sum
// must), in every thread: block_segments' warp segments (sums in red), then 32-value steps a
// lane each, then the lane.
template <class F>
__device__ int block_find(int lo, int hi, F f, unsigned long long thr, unsigned long long* red,
                          int* found) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int sg = (hi - lo + nw * 32 - 1) / (nw * 32) * 32;
    const int wlo = min(hi, lo + warp * sg), whi = min(hi, wlo + sg);
    block_segments(lo, hi, f, red);
    unsigned long long rem = thr;
    int w = 0;
    while (w < nw - 1 && red[w] <= rem) rem -= red[w++];
    if (warp == w) {
        for (int g = wlo; g < whi; g += 32 * 32) {
            const int st = g + lane * 32;
            unsigned long long s = 0;
            for (int j = st; j < min(st + 32, whi); ++j) s += f(j);
            unsigned long long incl = warp_incl_u64(s, lane);
            const unsigned hit = __ballot_sync(0xffffffffu, incl > rem);
            if (!hit) {
                rem -= __shfl_sync(0xffffffffu, incl, 31);
                continue;
            }
            const int k = __ffs(hit) - 1;
            rem -= __shfl_sync(0xffffffffu, incl - s, k);
            const int j0 = g + k * 32 + lane;
            s = j0 < whi ? f(j0) : 0ull;
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
// The group's first i in [0, n) whose running sum of f over 0..=i exceeds thr (the row's sum
// must), in every thread of every block: each block's segment sum, the owner's find, and the
// index from the owner.
template <class F>
__device__ int grp_find(Grp& g, GrpWords* xw, F f, unsigned long long thr,
                        unsigned long long* red, int* found) {
    if (g.size == 1) return block_find(g.lo, g.hi, f, thr, red, found);
    unsigned long long t, base;
    const int o = grp_owner(
        g, xw, block_segments(g.lo, g.hi, f, red), [=](unsigned long long) { return thr; }, t,
        base);
    const int j = g.rank == o ? block_find(g.lo, g.hi, f, thr - base, red, found) : -1;
    const int s = grp_publish(g, xw, (unsigned long long)(unsigned)j);
    return (int)(unsigned)grp_ld64(&xw->w[s][0], o);
}

// ---- the radix selects of pick_filtered ----
struct RadixScratch {
    unsigned lo[2][1024], hi[2][1024];  // 64-bit sums as two words, two histograms (alternate)
    unsigned long long above;           // the selected bin's S above it
    unsigned prefix;                    // the digits selected so far
};
// rs's bin += v in histogram h, exactly, by 32-bit atomics with the carry counted once: sm_90
// has no native 64-bit add in shared memory (a u64 atomicAdd there is a compare-and-swap
// spin). An atomic a lane: aggregating a warp's lanes by bin first (__match_any_sync,
// __reduce_add_sync) cost ~4x the whole select (bench/cuda/v2lite.md, session 33).
__device__ __forceinline__ void hist_add(RadixScratch* rs, int h, unsigned bin,
                                         unsigned long long v) {
    const unsigned lo = (unsigned)v;
    const unsigned old = atomicAdd(&rs->lo[h][bin], lo);
    const unsigned hi = (unsigned)(v >> 32) + (old + lo < old ? 1u : 0u);
    if (hi) atomicAdd(&rs->hi[h][bin], hi);
}
// Bin b of histogram h summed over the group's blocks.
__device__ __forceinline__ unsigned long long hist_bin(const Grp& g, RadixScratch* rs, int h,
                                                       int b) {
    if (g.size == 1) return ((unsigned long long)rs->hi[h][b] << 32) | rs->lo[h][b];
    unsigned long long s = 0;
    for (int r = 0; r < g.size; ++r)
        s += ((unsigned long long)grp_ld32(&rs->hi[h][b], r) << 32) | grp_ld32(&rs->lo[h][b], r);
    return s;
}
// The largest key v (the bits of a probability: monotone for p >= 0, at most 0x3F800000 <
// 2^30) whose S(v) = sum of f(i, p) over the i with key >= v reaches target (S(0) must), by a
// radix select over the key's three 10-bit digits (bits 29-20, 19-10, 9-0): a pass over the
// row each, summing f into the bins of the keys that match the digits selected so far, then
// the highest bin where S, summed from the top, reaches target; above = S(v + 1). Sums are
// integers, so the bins' atomic adds in any order give bisection's v exactly. In a cluster
// each block bins its segment and reads the group's bins (hist_bin) after a barrier; every
// block then selects the same digit.
template <class F>
__device__ unsigned radix_key(Grp& g, int n, const float* prob, F f, unsigned long long target,
                              unsigned long long& above, unsigned long long* red,
                              RadixScratch* rs) {
    const int nb = 1024, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    unsigned prefix = 0;
    unsigned long long ab = 0;  // S over the keys whose selected digits exceed prefix
#ifdef PICK_LAB_NO_RADIX  // lab only (wrong picks): the draw's other passes alone
    above = 0;
    return 0;
#endif
    for (int shift = 20; shift >= 0; shift -= 10) {
        const int h = g.hists++ & 1;
        for (int b = t; b < nb; b += blockDim.x) rs->lo[h][b] = rs->hi[h][b] = 0;
        if (t == 0) {  // kept where no bin reaches target (only under the lab defines)
            rs->prefix = prefix << 10;
            rs->above = ab;
        }
        __syncthreads();
#ifdef PICK_LAB_NO_ATOMICS
        unsigned long long sink = 0;
#endif
        row_trips(prob, n, g.lo, g.hi, [&](int i, float p, bool v) {
            const unsigned key = __float_as_uint(p);
            if (v && (key >> (shift + 10)) == prefix) {
                const unsigned long long x = f(i, p);
#ifdef PICK_LAB_NO_ATOMICS  // lab only (wrong picks): the pass without its atomics
                sink += x + key;
#else
                if (x) hist_add(rs, h, (key >> shift) & (nb - 1), x);
#endif
            }
        });
#ifdef PICK_LAB_NO_ATOMICS
        if (sink == 1ull) rs->lo[h][0] = 1u;  // kept: the pass's loads and tests stay
#endif
        if (g.size > 1) {
            grp_barrier();  // every block's bins are in
        } else {
            __syncthreads();
        }
        // thread t takes bin 1023 - t (block 1024): S of the bins above it, then its own
        const unsigned long long local = t < nb ? hist_bin(g, rs, h, nb - 1 - t) : 0ull;
        const unsigned long long incl = warp_incl_u64(local, lane);
        if (lane == 31) red[warp] = incl;
        __syncthreads();
        unsigned long long run = ab + incl - local;  // S of the bins above this thread's
        for (int w = 0; w < warp; ++w) run += red[w];
        if (t < nb && run < target && run + local >= target) {  // the one bin that reaches it
            rs->prefix = (prefix << 10) | (unsigned)(nb - 1 - t);
            rs->above = run;
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
// overwritten with its probabilities (each block its segment); min-p, then top-k by a count
// radix select over the keys and the ties' id cut, then top-p by a weight radix select and
// its ties' cut, then the draw.
__device__ int pick_filtered(Grp& g, GrpWords* xw, float* row, int n, float mx, float inv_t,
                             unsigned long long random, unsigned top_k, float top_p, float min_p,
                             unsigned long long* red, int* found, RadixScratch* rs) {
    const float* prob = row;
    const float min_keep = min_p > 0.0f ? min_p : 0.0f;
    auto k0 = [=](float p) { return p > 0.0f && p >= min_keep; };
    // the probabilities written over the logits, counting those min-p keeps
    const unsigned long long n0 = grp_sum(g, xw,
                                          block_sum_u64(
                                              row, n, g.lo, g.hi,
                                              [&](int i, float l) {
                                                  const float p = softmax_prob(l, mx, inv_t);
                                                  row[i] = p;
                                                  return k0(p) ? 1ull : 0ull;
                                              },
                                              red));
    bool use_k = false;
    unsigned vk = 0;
    int cut_k = -1;
    if (top_k != 0u && (unsigned long long)top_k < n0) {
        use_k = true;
        unsigned long long above;
        vk = radix_key(g, n, prob, [&](int, float p) { return k0(p) ? 1ull : 0ull; }, top_k,
                       above, red, rs);
        cut_k = grp_find(
            g, xw,
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
        const unsigned long long total = grp_sum(
            g, xw,
            block_sum_u64(
                prob, n, g.lo, g.hi,
                [&](int i, float p) { return k1(i, p) ? prob_weight(p) : 0ull; }, red));
        // mlaserve_model::draw::nucleus_target
        unsigned long long target =
            (unsigned long long)ceil(__dmul_rn((double)top_p, __ull2double_rn(total)));
        target = max(min(target, total), 1ull);  // draw::rank_cut's need.max(1)
        unsigned long long above;
        vp = radix_key(
            g, n, prob, [&](int i, float p) { return k1(i, p) ? prob_weight(p) : 0ull; }, target,
            above, red, rs);
        cut_p = grp_find(
            g, xw,
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
    const unsigned long long total =
        grp_sum(g, xw, block_sum_u64(prob, n, g.lo, g.hi, w2, red));
    return grp_find(g, xw, [&](int i) { return w2(i, prob[i]); }, __umul64hi(random, total),
                    red, found);
}

// ---- the kernel ----
// out[r] = row r's RowArgmax {the lowest index of the row's largest value among those that
// are neither NaN nor +inf (0 if none is above -inf), that value's bits (-inf if none), the
// lowest index holding NaN or +inf (0xffffffff if none), its bits}; picked[r] = the token
// its draw chose: draws == 0 or draws[8r + 3] == 0 (greedy) the argmax, else one softmax
// draw by mlaserve_model::draw's integer weights with draws[8r..8r+8] = {1/temperature bits,
// the random u64's low word, its high word, 1, top_k (0: off), top_p bits (>= 1: off), min_p
// bits (<= 0: off), 0} (a row with NaN / +inf or nothing above -inf: the argmax). A row drawn
// with a filter is overwritten with its probabilities (pick_filtered). logits [rows, vocab]
// f32, 16-byte aligned where vocab % 4 == 0 (float4 loads). grid (rows * C), block 1024 (a
// bin of the radix selects a thread), in clusters of C along x (C = 1: no cluster).
// The row's pick by this block of its group (every thread of the block calls it).
__device__ void pick_row(Grp& g, GrpWords* xw, float* row, int vocab, const unsigned* d,
                         uint4* out, unsigned* picked, RadixScratch* rs) {
    __shared__ float sv[32];
    __shared__ unsigned si[32], sb[32];
    __shared__ unsigned long long wsum[32], rem_s;
    __shared__ int warp_s;
    float bv = -INFINITY;
    unsigned bi = 0xffffffffu, badi = 0xffffffffu;
    if ((vocab & 3) == 0) {  // rows 16-byte aligned, segments multiples of 4: float4 loads
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int j = g.lo / 4 + threadIdx.x; j < g.hi / 4; j += blockDim.x) {
            const float4 q = r4[j];
            const unsigned i = 4u * j;
            argmax_take(q.x, i, bv, bi, badi);
            argmax_take(q.y, i + 1, bv, bi, badi);
            argmax_take(q.z, i + 2, bv, bi, badi);
            argmax_take(q.w, i + 3, bv, bi, badi);
        }
    } else {
        for (int j = g.lo + threadIdx.x; j < g.hi; j += blockDim.x) argmax_take(row[j], j, bv, bi, badi);
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
    argmax_warp(bv, bi, badi);  // every warp: the segment's (max, index, first unusable)
    if (g.size > 1) {           // the group's, from every block's
        const int s = grp_publish(g, xw, __float_as_uint(bv), bi, badi);
        const bool in = lane < g.size;
        bv = in ? __uint_as_float((unsigned)grp_ld64(&xw->w[s][0], lane)) : -INFINITY;
        bi = in ? (unsigned)grp_ld64(&xw->w[s][1], lane) : 0xffffffffu;
        badi = in ? (unsigned)grp_ld64(&xw->w[s][2], lane) : 0xffffffffu;
        argmax_warp(bv, bi, badi);
    }
    const unsigned token = bv == -INFINITY ? 0u : bi;  // none above -inf: token 0, as the reference
    // group-uniform: whether the row is drawn (else its pick is the argmax)
    const bool drawn = d && d[3] != 0u && badi == 0xffffffffu && bv != -INFINITY;
    if (g.rank == 0 && threadIdx.x == 0) {
        const unsigned bad_bits = badi == 0xffffffffu ? 0u : __float_as_uint(row[badi]);
        *out = make_uint4(token, __float_as_uint(bv), badi, bad_bits);
        if (!drawn) *picked = token;
    }
    if (!drawn) return;
    const float inv_t = __uint_as_float(d[0]);
    const unsigned long long random = ((unsigned long long)d[2] << 32) | d[1];
    {
        const float top_p = __uint_as_float(d[5]), min_p = __uint_as_float(d[6]);
        if (!(d[4] == 0u && top_p >= 1.0f && min_p <= 0.0f)) {
            const int t = pick_filtered(g, xw, row, vocab, bv, inv_t, random, d[4], top_p, min_p,
                                        wsum, &warp_s, rs);
            if (g.rank == 0 && threadIdx.x == 0) *picked = t;
            return;
        }
    }
    // The draw. Warp w sums the weights of its segment [w sg, w sg + sg) of the block's in
    // steps of 32 e values (a lane's e = 4 consecutive ones: float4 loads, coalesced; e = 1
    // where the row is not float4-aligned); the group's running sums over its blocks give the
    // block where target = (random * total) >> 64 falls; there thread 0 finds the warp
    // segment, that warp the step (a lane a step, 32 at a time), then the lane, then the value.
    const int e = (vocab & 3) == 0 ? 4 : 1, w32 = 32 * e;
    const int sg = (g.hi - g.lo + nw * w32 - 1) / (nw * w32) * w32;
    const int lo = min(g.hi, g.lo + warp * sg), hi = min(g.hi, lo + sg);
    unsigned long long mine = 0;
    for (int j = lo + lane * e; j < hi; j += w32) mine += pick_weights(row, j, e, bv, inv_t);
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    if (lane == 0) wsum[warp] = mine;
    __syncthreads();
    unsigned long long bt = 0;
    for (int w = 0; w < nw; ++w) bt += wsum[w];
    unsigned long long target, base;
    const int owner = grp_owner(
        g, xw, bt, [&](unsigned long long total) { return __umul64hi(random, total); }, target,
        base);
    if (g.rank != owner) return;
    target -= base;  // < bt: the group's total >= 2^40 (the max's weight)
    if (threadIdx.x == 0) {
        unsigned long long b = 0;
        int w = 0;
        while (b + wsum[w] <= target) b += wsum[w++];
        warp_s = w;
        rem_s = target - b;
    }
    __syncthreads();
    if (warp != warp_s) return;
    unsigned long long rem = rem_s;
    for (int st0 = lo; st0 < hi; st0 += 32 * w32) {  // 32 steps: lane l sums step l's 32 e values
        const int st = st0 + lane * w32;
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
        const int j0 = st0 + k * w32 + lane * e;
        s = j0 < hi ? pick_weights(row, j0, e, bv, inv_t) : 0ull;
        incl = warp_incl_u64(s, lane);
        const unsigned at = __ballot_sync(0xffffffffu, incl > rem);
        if (lane == __ffs(at) - 1) {
            unsigned long long cum = incl - s;
            for (int j = j0; j < j0 + e; ++j) {
                cum += softmax_weight(row[j], bv, inv_t);
                if (cum > rem) {
                    *picked = j;
                    break;
                }
            }
        }
        return;
    }
}
extern "C" __global__ void __launch_bounds__(1024) logits_pick(float* logits, int vocab, const unsigned* draws,
                                       uint4* out, unsigned* picked) {
    MLA_PDL();
    __shared__ GrpWords xw;
    __shared__ RadixScratch rs;
    Grp g = grp_of(vocab);
    const int r = blockIdx.x / g.size;
    pick_row(g, &xw, logits + (i64)r * vocab, vocab, draws ? draws + 8 * r : nullptr, out + r,
             picked + r, &rs);
    if (g.size > 1) {  // no block leaves while another may still read its shared memory
        __syncwarp();
        grp_barrier();
    }
}
