//! Tensor-core absorbed MLA decode (`kernels/mla_decode.cu`, `kernels/mla_decode_wgmma.cu`):
//! the contract of [`Gpu::attn_mqa`] — q_lat [T, N, L] f32, the rope part of q [T, N*(P+R)]
//! f32, the paged bf16 latent cache [slots, L+R], per-query key lists, a split of each key list
//! over `splits` blocks and the LSE combine → o_lat [T, N, L] bf16 — on mma.sync m16n8k16
//! (sm_80+) or wgmma (sm_90a) bf16 tensor cores.
//!
//! Invariants: the kernels are written for the latent row of DeepSeek-V2/V3 and GLM-5,
//! L = kv_lora_rank = 512, R = qk_rope_head_dim = 64, and sm_80 or newer (bf16 mma, cp.async;
//! the copy-engine variants sm_90, the wgmma one exactly sm_90a); [`Gpu::attn_mqa_tc`] runs the
//! CUDA-core kernel for any other row or an older GPU. A block serves 16, 32 or 64 heads of one
//! token and one split, so the grid reads each cache row once per 16 (32, 64) heads. Each block
//! takes 172-227 KB of shared memory: one block per SM, so the split count decides how well the
//! SMs fill ([`Gpu::mqa_tc_splits`]; more splits than that cost 30-45% in the kernel lab).
//! `part` [T*N*splits*L] and `lse` [T*N*splits] are scratch, as for [`Gpu::attn_mqa`].
//! Measured variants, peer and ceilings: bench/cuda/mla_decode.md.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::Gpu;
use crate::ops::{AttnDims, KeyLists};
use cudarc::driver::LaunchConfig;

/// kv_lora_rank the kernels are written for.
pub const TC_L: usize = 512;
/// qk_rope_head_dim the kernels are written for.
pub const TC_R: usize = 64;
const THREADS: u32 = 256;
const TILE_BYTES: usize = 64 * 584 * 2; // 64 keys x (576 + 8 pad) bf16
const ROW_BYTES: usize = 584 * 2;
const P_ROW_BYTES: usize = 72 * 2;
const W64_TILE_BYTES: usize = 9 * 8192; // 64 rows x 576 bf16 as nine 64-column swizzled atoms

/// The kernel lab's ablations of W64's kernel (`mla_decode_wgmma.cu`: a stage left out, so
/// their outputs are not attention), for [`Gpu::attn_mqa_tc_kernel`] with [`MlaVariant::W64`].
pub const W64_ABLATIONS: [&str; 6] = [
    "mla_decode_w64_noload",
    "mla_decode_w64_nopv",
    "mla_decode_w64_nos",
    "mla_decode_w64_s",
    "mla_decode_w64_pv",
    "mla_decode_w64_bare",
];

/// One compiled variant of the kernel (see mla_decode.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaVariant {
    /// 16 heads a block, 3 cp.async stages, Q held in registers.
    M1S3Q,
    /// 32 heads a block, 2 stages, Q in shared memory.
    M2S2,
    /// 16 heads a block, 2 stages, Q in shared memory.
    M1S2,
    /// 32 heads a block, 2 stages, S split over features: Q slices in registers, partial
    /// scores summed in shared memory.
    M2K,
    /// M1S3Q with the cache rows copied by the sm_90 copy engine (cp.async.bulk + mbarrier).
    M1S3B,
    /// M2K with the cache rows copied by the sm_90 copy engine.
    M2KB,
    /// 64 heads a block on sm_90a warpgroup MMA (wgmma, `kernels/mla_decode_wgmma.cu`):
    /// warpgroup 0 computes S and the softmax, both compute half of O; Q, K/V and P in
    /// swizzled shared memory.
    W64,
}

impl MlaVariant {
    pub const ALL: [MlaVariant; 7] = [
        MlaVariant::M1S3Q,
        MlaVariant::M2S2,
        MlaVariant::M1S2,
        MlaVariant::M2K,
        MlaVariant::M1S3B,
        MlaVariant::M2KB,
        MlaVariant::W64,
    ];

    pub fn kernel(self) -> &'static str {
        match self {
            MlaVariant::M1S3Q => "mla_decode_m1s3q",
            MlaVariant::M2S2 => "mla_decode_m2s2",
            MlaVariant::M1S2 => "mla_decode_m1s2",
            MlaVariant::M2K => "mla_decode_m2k",
            MlaVariant::M1S3B => "mla_decode_m1s3b",
            MlaVariant::M2KB => "mla_decode_m2kb",
            MlaVariant::W64 => "mla_decode_w64",
        }
    }

    /// Heads one block serves (16 per m-tile).
    pub fn heads_per_block(self) -> usize {
        match self {
            MlaVariant::M2S2 | MlaVariant::M2K | MlaVariant::M2KB => 32,
            MlaVariant::W64 => 64,
            _ => 16,
        }
    }

    /// Whether a GPU of NVRTC arch `arch` runs this variant: bf16 mma and cp.async need
    /// sm_80, the copy-engine variants sm_90, wgmma exactly sm_90a (compute capability 9.0).
    pub fn runs_on(self, arch: &str) -> bool {
        if matches!(self, MlaVariant::W64) {
            return arch == "sm_90a";
        }
        let sm: u32 = arch
            .trim_start_matches("sm_")
            .trim_end_matches('a')
            .parse()
            .unwrap_or(0);
        match self {
            MlaVariant::M1S3B | MlaVariant::M2KB => sm >= 90,
            _ => sm >= 80,
        }
    }

    fn stages(self) -> usize {
        match self {
            MlaVariant::M1S3Q | MlaVariant::M1S3B => 3,
            _ => 2,
        }
    }

    /// Dynamic shared memory of one block; mirrors the carving at the top of each kernel
    /// body in mla_decode.cu.
    pub fn smem_bytes(self) -> usize {
        let rows = self.heads_per_block();
        let tiles = self.stages() * TILE_BYTES;
        let slots = self.stages() * (64 * 8 + 8); // slots and one mbarrier per stage
        let p = rows * P_ROW_BYTES;
        match self {
            // Q, 2 stages and P as 64-row swizzled atoms, slots, row maxima, 1 KB alignment.
            MlaVariant::W64 => 3 * W64_TILE_BYTES + 8192 + 2 * 64 * 8 + 2 * 64 * 4 + 1024,
            // stages, partial S [4][rows][72] f32, P, per-row f32, slots
            MlaVariant::M2K | MlaVariant::M2KB => tiles + 4 * rows * 72 * 4 + p + rows * 4 + slots,
            // stages, Q (unless in registers), P, row maxima [8 warps][rows] f32, slots
            MlaVariant::M1S3Q | MlaVariant::M1S3B => tiles + p + 8 * rows * 4 + slots,
            _ => tiles + rows * ROW_BYTES + p + 8 * rows * 4 + slots,
        }
    }

    /// The default for a head count on a GPU of NVRTC arch `arch`, the fastest in the kernel
    /// lab on the H200 (bench/cuda/mla_decode.md): on sm_90a the wgmma kernel for every head
    /// count (at 16 heads it pads the block to 64 rows and still streams the cache at 83-102%
    /// of the copy ceiling, against 70-84% for M1S3Q); elsewhere from 32 heads 32 a block with
    /// the feature-split S, else 16 heads with Q in registers and 3 stages. The copy-engine
    /// variants measured 15-25% slower and are not chosen.
    pub fn choose(heads: usize, arch: &str) -> Self {
        if MlaVariant::W64.runs_on(arch) {
            MlaVariant::W64
        } else {
            MlaVariant::choose_mma_sync(heads)
        }
    }

    /// The mma.sync default for a head count (every sm_80+ GPU): M2K from 32 heads, else M1S3Q.
    pub fn choose_mma_sync(heads: usize) -> Self {
        if heads >= 32 {
            MlaVariant::M2K
        } else {
            MlaVariant::M1S3Q
        }
    }
}

/// What the wgmma decode kernel may read before its wait on the kernel just before it (a
/// memory round trip off a small step's critical path); the other kernels read nothing early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Early {
    /// Nothing: any input may come from the kernel just before.
    No,
    /// Its first key tile: the key lists, block tables and cache rows were all written before
    /// the kernel just before this one began (kv_finish, then mla_q_absorb, then the decode).
    Tile,
    /// Its first key tile but each token's new row, cache row `new_slots[t]` (the step's
    /// slots [T] i64), which the kernel just before writes (mla_q_absorb with kv_finish fused)
    /// and the decode copies after its wait. Only for steps whose key lists hold no other
    /// token's new row: one token a sequence (the executor's `kv_in_absorb`), sequences
    /// sharing only full cache blocks (prefix caching shares whole blocks before the last).
    TileButNew(u64),
}

impl Early {
    /// The kernel's `early` and `new_slots` arguments (MLA_PARAMS in mla_decode.cu).
    fn args(self) -> (i32, u64) {
        match self {
            Early::No => (0, 0),
            Early::Tile => (1, 0),
            Early::TileButNew(slots) => (2, slots),
        }
    }
}

impl Gpu {
    /// [`Gpu::attn_mqa`] on tensor cores where L = 512 and R = 64 on sm_80 or newer (variant
    /// by head count), else on the CUDA-core kernel. Same arguments, same outputs. `early`:
    /// what the wgmma kernel may fetch before its wait ([`Early`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attn_mqa_tc(
        &self,
        d: &AttnDims,
        q_lat: u64,
        q: u64,
        cache: u64,
        keys: &KeyLists,
        block_tables: u64,
        bt_off: u64,
        block_size: usize,
        splits: usize,
        part: u64,
        lse: u64,
        o_lat: u64,
        early: Early,
    ) -> Result<()> {
        let v = self.mqa_tc_variant(d.heads);
        if d.l != TC_L
            || d.r != TC_R
            || !v.runs_on(self.arch)
            || v.smem_bytes() > self.max_smem_per_block
        {
            return self.attn_mqa(
                d,
                q_lat,
                q,
                cache,
                keys,
                block_tables,
                bt_off,
                block_size,
                splits,
                part,
                lse,
                o_lat,
            );
        }
        self.attn_mqa_tc_kernel(
            v,
            v.kernel(),
            d,
            q_lat,
            q,
            cache,
            keys,
            block_tables,
            bt_off,
            block_size,
            splits,
            part,
            lse,
            o_lat,
            early,
        )
    }

    /// Variant `v`'s launch (the kernel lab and the op table run each) with kernel `name` in
    /// its place: `v.kernel()`, or one of the kernel lab's ablations of it
    /// (`mla_decode_w64_noload`, ...: a stage left out, so their outputs are not attention),
    /// which share its grid, block and shared memory.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_mqa_tc_kernel(
        &self,
        v: MlaVariant,
        name: &'static str,
        d: &AttnDims,
        q_lat: u64,
        q: u64,
        cache: u64,
        keys: &KeyLists,
        block_tables: u64,
        bt_off: u64,
        block_size: usize,
        splits: usize,
        part: u64,
        lse: u64,
        o_lat: u64,
        early: Early,
    ) -> Result<()> {
        if d.l != TC_L || d.r != TC_R {
            return Err(CudaError::Invalid(format!(
                "tensor-core MLA decode needs a latent row of {TC_L}+{TC_R}, got {}+{}",
                d.l, d.r
            )));
        }
        if !v.runs_on(self.arch) {
            return Err(CudaError::Invalid(format!(
                "MLA decode variant {v:?} does not run on this GPU ({})",
                self.arch
            )));
        }
        if splits == 0 || block_size == 0 {
            return Err(CudaError::Invalid(format!(
                "MLA decode with {splits} splits and block size {block_size}"
            )));
        }
        let groups = d.heads.div_ceil(v.heads_per_block());
        let blocks = d.t * groups * splits;
        if blocks > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "MLA decode grid of {blocks} blocks (T {} x groups {groups} x splits {splits})",
                d.t
            )));
        }
        let smem = v.smem_bytes();
        self.raise_smem(name, smem)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (bs, nh, p, ns) = (block_size as i32, d.heads as i32, d.p as i32, splits as i32);
        let scale_log2 = d.scale * std::f32::consts::LOG2_E;
        let (nk, so, sp) = (keys.n_keys, keys.sel_off, keys.sel_pos);
        let (early, new_slots) = early.args();
        self.launch(
            name,
            cfg,
            &args![
                q_lat,
                q,
                cache,
                part,
                lse,
                nk,
                so,
                sp,
                block_tables,
                bt_off,
                bs,
                nh,
                p,
                ns,
                scale_log2,
                early,
                new_slots
            ],
        )?;
        if o_lat == 0 {
            return Ok(());
        }
        let l = d.l as i32;
        self.launch(
            "attn_mqa_combine",
            Gpu::cfg(((d.t * d.heads) as u32, 1, 1), 256),
            &args![part, lse, o_lat, ns, l],
        )
    }

    /// The variant [`Gpu::attn_mqa_tc`] runs for `heads` heads: [`MlaVariant::choose`], with
    /// the wgmma kernel left out under `MLASERVE_WGMMA_DECODE=0` (a knob for comparisons).
    pub fn mqa_tc_variant(&self, heads: usize) -> MlaVariant {
        static WGMMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let wgmma = *WGMMA
            .get_or_init(|| std::env::var("MLASERVE_WGMMA_DECODE").map_or(true, |v| v != "0"));
        if wgmma {
            MlaVariant::choose(heads, self.arch)
        } else {
            MlaVariant::choose_mma_sync(heads)
        }
    }

    /// A split count for [`Gpu::attn_mqa_tc`]: one block per SM runs at a time, so take the
    /// count whose last wave fills the SMs best (fewest splits within 3% of the best), with
    /// at least 256 keys a split (64 on a tiny grid of blocks serving ≤ 16 heads) and at most
    /// `max_splits` ([`pick_splits`]).
    pub fn mqa_tc_splits(
        &self,
        t: usize,
        heads: usize,
        max_keys: usize,
        max_splits: usize,
    ) -> Result<usize> {
        let sms = self.sm_count;
        let hpb = self.mqa_tc_variant(heads).heads_per_block();
        let groups = t.max(1) * heads.div_ceil(hpb);
        Ok(pick_splits(
            groups,
            heads.min(hpb),
            sms,
            max_keys,
            max_splits,
            small_split_keys(),
        ))
    }
}

/// See [`Gpu::mqa_tc_splits`]; `units` = tokens x head groups, `rows` = heads a block
/// serves (queries staged per block), `small_keys` = keys a split at least on a tiny grid.
pub fn pick_splits(
    units: usize,
    rows: usize,
    sms: usize,
    max_keys: usize,
    max_splits: usize,
    small_keys: usize,
) -> usize {
    // At least 256 keys a split. A decode of a few tokens is latency-bound, so when the
    // blocks would fill under 1/8 of the SMs, blocks serving ≤ 16 heads take splits of one
    // 64-key tile (bench/cuda/decode_profile.md: 17.8 -> 13.0 µs at b1, ctx 512, measured on
    // M1S3Q; W64 padding 16 heads to 64 rows stages only the 16 heads' queries); blocks of
    // 32-64 heads stay at 256, their f32 queries (74-147 KB a block) weighing like 64-128
    // cache rows (session 6 lab, B16 H64 ctx 1,024: 4 splits 24.4 µs, 8 26.8, 16 47.7).
    let min_keys = if units * 8 <= sms && rows <= 16 {
        small_keys
    } else {
        256
    };
    let cap = max_splits.min(max_keys.div_ceil(min_keys)).max(1);
    let fill = |s: usize| {
        let blocks = units * s;
        blocks as f64 / (blocks.div_ceil(sms) * sms) as f64
    };
    let best = (1..=cap).map(fill).fold(0f64, f64::max);
    (1..=cap).find(|&s| fill(s) >= best * 0.97).unwrap_or(1)
}

/// [`pick_splits`]'s `small_keys`: 64, one tile (`MLASERVE_DECODE_SPLIT_KEYS=N` for
/// comparisons; a multiple of 64 keeps whole tiles).
fn small_split_keys() -> usize {
    static KEYS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| {
        std::env::var("MLASERVE_DECODE_SPLIT_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&k: &usize| k > 0)
            .unwrap_or(64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_sms() {
        // B=64, 16 heads, ctx 4096 on 132 SMs: 2 splits = 128 blocks, 97% of one wave.
        assert_eq!(pick_splits(64, 16, 132, 4096, 16, 64), 2);
        // B=128: one split already fills 97%.
        assert_eq!(pick_splits(128, 16, 132, 8192, 16, 64), 1);
        // Batch 1: as many splits as allowed, one 64-key tile each at least.
        assert_eq!(pick_splits(1, 16, 132, 4096, 16, 64), 16);
        assert_eq!(pick_splits(1, 16, 132, 300, 16, 64), 5);
        assert_eq!(pick_splits(1, 16, 132, 513, 16, 64), 9);
        assert_eq!(pick_splits(1, 16, 132, 1, 16, 64), 1);
        // 64-head blocks keep 256 keys a split: B16 at 1,024 keys takes 4, B1 at 8,192 16.
        assert_eq!(pick_splits(16, 64, 132, 1024, 16, 64), 4);
        assert_eq!(pick_splits(1, 64, 132, 8192, 16, 64), 16);
    }

    #[test]
    fn shared_memory_fits_one_block_per_sm() {
        for v in MlaVariant::ALL {
            assert!(v.smem_bytes() <= 227 * 1024, "{v:?}: {}", v.smem_bytes());
        }
        assert_eq!(MlaVariant::M1S3Q.smem_bytes(), 228_608 + 24);
        assert_eq!(MlaVariant::M2K.smem_bytes(), 192_128 + 16);
        assert_eq!(MlaVariant::W64.smem_bytes(), 231_936);
    }

    #[test]
    fn every_variant_and_ablation_is_a_loaded_kernel() {
        for name in MlaVariant::ALL
            .map(MlaVariant::kernel)
            .iter()
            .chain(&W64_ABLATIONS)
        {
            assert!(crate::kernels::NAMES.contains(name), "{name}");
        }
    }

    #[test]
    fn variants_by_arch() {
        assert!(MlaVariant::M1S3B.runs_on("sm_90") && MlaVariant::M1S3B.runs_on("sm_120"));
        assert!(!MlaVariant::M1S3B.runs_on("sm_89") && MlaVariant::M1S3Q.runs_on("sm_80"));
        assert!(!MlaVariant::M1S3Q.runs_on("sm_75"));
        assert!(MlaVariant::W64.runs_on("sm_90a") && !MlaVariant::W64.runs_on("sm_90"));
        assert!(!MlaVariant::W64.runs_on("sm_100") && MlaVariant::M2K.runs_on("sm_90a"));
        assert_eq!(MlaVariant::choose(16, "sm_90a"), MlaVariant::W64);
        assert_eq!(MlaVariant::choose(16, "sm_90"), MlaVariant::M1S3Q);
        assert_eq!(MlaVariant::choose(32, "sm_80"), MlaVariant::M2K);
        assert_eq!(MlaVariant::choose(64, "sm_90a"), MlaVariant::W64);
        assert_eq!(MlaVariant::choose(128, "sm_90a"), MlaVariant::W64);
        assert_eq!(MlaVariant::choose(128, "sm_89"), MlaVariant::M2K);
    }
}
