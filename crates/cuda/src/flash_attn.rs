//! Tensor-core prefill attention (`kernels/flash_attn.cu`, `kernels/flash_attn_wgmma.cu`): the
//! contract of [`Gpu::attn_mha`] for dense causal key lists (token t attends to positions
//! 0..n_keys[t] of its sequence, found at rows kv_base[t] + p of the decompressed K/V), in the
//! FlashAttention-2 scheme on mma.sync m16n8k16 bf16 tensor cores, and on sm_90a at qk 192 /
//! v 128 and 256 on warpgroup MMA ([`FA_WGMMA_VARIANTS`], [`FaVariant::choose`]).
//!
//! Invariants:
//! - Work comes as query tiles ([`fa_tiles`]): up to [`FA_BM`] consecutive tokens of one
//!   sequence each, so every row of a tile shares kv_base. Rows outside the tiles are not
//!   written.
//! - q, k and v are packed into bf16 first (zero-padded per head to the variant's widths,
//!   which changes no dot product); scores, softmax, sums and the output stay f32.
//! - sm_80 or newer (the wgmma kernels: exactly sm_90a); qk ≤ 256 and v ≤ 256
//!   ([`FaVariant::for_dims`]). Otherwise, and for DSA's
//!   sparse key lists, the CUDA-core `attn_mha` runs.
//!
//! Measured variants, the peer (torch SDPA: cuDNN and FlashAttention-2) and the ceilings:
//! bench/cuda/flash_attn.md.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use crate::ops::AttnDims;
use cudarc::driver::LaunchConfig;

/// One compiled variant (an FA_ENTRY line of flash_attn.cu, or FW_ENTRY of
/// flash_attn_wgmma.cu): head widths (q/k and v, zero-padded up to them), keys per tile,
/// warps, m-tiles of 16 query rows per warp, and whether it is the sm_90a wgmma kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaVariant {
    pub kernel: &'static str,
    pub dq: usize,
    pub dv: usize,
    pub bn: usize,
    pub warps: usize,
    pub mt: usize,
    pub wgmma: bool,
}

const fn fa(kernel: &'static str, dq: usize, dv: usize, bn: usize, warps: usize) -> FaVariant {
    FaVariant {
        kernel,
        dq,
        dv,
        bn,
        warps,
        mt: 1,
        wgmma: false,
    }
}

/// 4 warps of two m-tiles (32 query rows) each: Q read from shared memory.
const fn fa_m2(kernel: &'static str, dq: usize, dv: usize, bn: usize) -> FaVariant {
    FaVariant {
        kernel,
        dq,
        dv,
        bn,
        warps: 4,
        mt: 2,
        wgmma: false,
    }
}

/// The sm_90a wgmma kernel (flash_attn_wgmma.cu): two warpgroups of 64 query rows sharing
/// K/V tiles of `bn` keys, P kept in registers as the A operand of P·V.
const fn fa_wg(kernel: &'static str, dq: usize, dv: usize, bn: usize) -> FaVariant {
    FaVariant {
        kernel,
        dq,
        dv,
        bn,
        warps: 8,
        mt: 1,
        wgmma: true,
    }
}

/// The mma.sync variants the executor chooses from (on sm_90a the wgmma kernel of the same
/// widths replaces the two widest), narrowest first; the fastest of the kernel lab per width
/// (bench/cuda/flash_attn.md): 8 warps sharing 64-key tiles at 256, 4 warps below (at
/// 192/128 the 8-warp and 32-row variants win only at 8k+ tokens and lose on short chunks).
pub const FA_VARIANTS: [FaVariant; 4] = [
    fa("fa_fwd_d64", 64, 64, 64, 4),
    fa("fa_fwd_d128", 128, 128, 64, 4),
    fa("fa_fwd_d192v128", 192, 128, 64, 4),
    fa("fa_fwd_d256_w8", 256, 256, 64, 8),
];

/// The sm_90a wgmma kernels, which the executor takes on compute capability 9.0 in place of
/// the mma.sync variant of the same widths: 1.3-1.6x it in the kernel lab (294-372 TFLOP/s
/// at 4k-8k tokens in session 6's run 2, bench/cuda/flash_attn.md).
pub const FA_WGMMA_VARIANTS: [FaVariant; 2] = [
    fa_wg("fa_fwd_wg_d192v128", 192, 128, 128),
    fa_wg("fa_fwd_wg_d256", 256, 256, 64),
];

/// Further variants timed by the kernel lab (examples/flash_attn.rs), never chosen. The `_sf`
/// ones (wgmma, S issued before the next tile's copies) were added in session 6.
pub const FA_LAB_VARIANTS: [FaVariant; 8] = [
    fa("fa_fwd_d192v128_w8", 192, 128, 64, 8),
    fa("fa_fwd_d256", 256, 256, 32, 4),
    fa("fa_fwd_d256_w8n32", 256, 256, 32, 8),
    fa_m2("fa_fwd_d192v128_m2", 192, 128, 64),
    fa_m2("fa_fwd_d192v128_m2n32", 192, 128, 32),
    fa_m2("fa_fwd_d128_m2", 128, 128, 64),
    fa_wg("fa_fwd_wg_d192v128_sf", 192, 128, 128),
    fa_wg("fa_fwd_wg_d256_sf", 256, 256, 64),
];

/// Every compiled variant: the executor's, the wgmma ones, the lab's.
pub fn fa_all_variants() -> impl Iterator<Item = FaVariant> {
    FA_VARIANTS
        .into_iter()
        .chain(FA_WGMMA_VARIANTS)
        .chain(FA_LAB_VARIANTS)
}

impl FaVariant {
    /// The narrowest variant holding qk = P+R and v, if any.
    pub fn for_dims(qk: usize, v: usize) -> Option<FaVariant> {
        FA_VARIANTS
            .iter()
            .copied()
            .find(|f| f.dq >= qk && f.dv >= v)
    }

    /// The variant the executor runs for qk = P+R and v on a GPU of NVRTC arch `arch`: the
    /// narrowest mma.sync variant ([`FaVariant::for_dims`]), replaced on sm_90a by the wgmma
    /// kernel of the same widths when there is one (192/128 and 256; the narrower widths of
    /// small models stay on mma.sync, where padding to 192 would waste the tensor cores).
    /// `wgmma = false` keeps mma.sync everywhere.
    pub fn choose(qk: usize, v: usize, arch: &str, wgmma: bool) -> Option<FaVariant> {
        let f = Self::for_dims(qk, v)?;
        let wgmma = wgmma && arch == "sm_90a";
        let wg = FA_WGMMA_VARIANTS
            .iter()
            .find(|w| w.dq == f.dq && w.dv == f.dv);
        Some(match wg {
            Some(w) if wgmma => *w,
            _ => f,
        })
    }

    /// Query rows per tile.
    pub fn bm(&self) -> usize {
        16 * self.warps * self.mt
    }

    /// Dynamic shared memory of one block: Q [bm][dq+8], K [2][bn][dq+8], V [2][bn][dv+8]
    /// bf16; for wgmma unpadded swizzled tiles from a 1 KB-aligned base (1 KB of slack).
    pub fn smem_bytes(&self) -> usize {
        if self.wgmma {
            return 2 * (self.bm() * self.dq + 2 * self.bn * self.dq + 2 * self.bn * self.dv)
                + 1024;
        }
        2 * (self.bm() * (self.dq + 8) + 2 * self.bn * (self.dq + 8) + 2 * self.bn * (self.dv + 8))
    }
}

/// Query tiles for the token ranges `[start, end)` of the sequences taking this path: pairs
/// (first token, token count), at most `bm` ([`FaVariant::bm`]) tokens each and never across
/// a range. Longest key lists first (the last tile of a long prompt has the most keys), so
/// the heaviest blocks start first.
pub fn fa_tiles(ranges: &[(usize, usize)], n_keys: &[i32], bm: usize) -> Vec<i32> {
    let bm = bm.max(1); // a tile holds at least one token, so the walk always advances
    let mut tiles: Vec<(i32, i32, i32)> = Vec::new();
    for &(a, b) in ranges {
        let mut t = a;
        while t < b {
            let n = (b - t).min(bm);
            let work = n_keys[t..t + n].iter().copied().max().unwrap_or(0);
            tiles.push((work, t as i32, n as i32));
            t += n;
        }
    }
    tiles.sort_by_key(|x| std::cmp::Reverse(x.0));
    tiles.into_iter().flat_map(|(_, t, n)| [t, n]).collect()
}

impl Gpu {
    /// Whether this GPU runs the tensor-core prefill kernels (bf16 mma and cp.async: sm_80).
    pub fn has_flash_attn(&self) -> bool {
        let sm: u32 = self
            .arch
            .trim_start_matches("sm_")
            .trim_end_matches('a')
            .parse()
            .unwrap_or(0);
        sm >= 80
    }

    /// Tensor-core causal attention with variant `f` for the tokens of `tiles` ([`fa_tiles`]
    /// with `f.bm()`, `n_tiles` pairs): q [T, N*(P+R)], k_nope [S, N*P], kpe [S, R],
    /// v [S, N*V] f32 → out [T, N*V] f32 (tiled rows only). `n_keys` [T] and `kv_base` [T] as
    /// for [`Gpu::attn_mha`] (dense lists).
    #[allow(clippy::too_many_arguments)]
    pub fn attn_flash(
        &self,
        d: &AttnDims,
        f: &FaVariant,
        q: u64,
        k_nope: u64,
        kpe: u64,
        v: u64,
        s_rows: usize,
        out: u64,
        tiles: u64,
        n_tiles: usize,
        n_keys: u64,
        kv_base: u64,
    ) -> Result<()> {
        self.fa_check(d, f)?;
        let (qb, kb, vb) = self.fa_pack(d, f, q, k_nope, kpe, v, s_rows)?;
        self.attn_flash_packed(d, f, &qb, &kb, &vb, out, tiles, n_tiles, n_keys, kv_base)
    }

    /// Whether variant `f` runs `d`'s head dims on this GPU; the error names why not.
    pub fn fa_check(&self, d: &AttnDims, f: &FaVariant) -> Result<()> {
        let qk = d.p + d.r;
        if f.dq < qk || f.dv < d.v {
            return Err(CudaError::Invalid(format!(
                "{} holds qk <= {} and v <= {}, the model has qk={qk} v={}",
                f.kernel, f.dq, f.dv, d.v
            )));
        }
        if !self.has_flash_attn() {
            return Err(CudaError::Invalid(format!(
                "tensor-core attention needs sm_80 or newer, this GPU is {}",
                self.arch
            )));
        }
        if f.wgmma && self.arch != "sm_90a" {
            return Err(CudaError::Invalid(format!(
                "{} needs sm_90a (wgmma), this GPU is {}",
                f.kernel, self.arch
            )));
        }
        if f.smem_bytes() > self.max_smem_per_block {
            return Err(CudaError::Invalid(format!(
                "{} needs {} bytes of shared memory per block, this GPU allows {}",
                f.kernel,
                f.smem_bytes(),
                self.max_smem_per_block
            )));
        }
        Ok(())
    }

    /// Packs q [T, N*(P+R)] → qb [T, N, dq] and k_nope/kpe/v → kb [S, N, dq], vb [S, N, dv],
    /// bf16, zero-padded per head.
    #[allow(clippy::too_many_arguments)]
    pub fn fa_pack(
        &self,
        d: &AttnDims,
        f: &FaVariant,
        q: u64,
        k_nope: u64,
        kpe: u64,
        v: u64,
        s_rows: usize,
    ) -> Result<(DBuf<u16>, DBuf<u16>, DBuf<u16>)> {
        let n = d.heads;
        let qb = self.alloc::<u16>(d.t * n * f.dq)?;
        let kb = self.alloc::<u16>(s_rows * n * f.dq)?;
        let vb = self.alloc::<u16>(s_rows * n * f.dv)?;
        let grid = |rows: usize| rows.div_ceil(8) as u32;
        let (rows, qk, dq) = ((d.t * n) as i32, (d.p + d.r) as i32, f.dq as i32);
        let (qb_p, kb_p, vb_p) = (qb.ptr(), kb.ptr(), vb.ptr());
        self.launch(
            "fa_pack_q",
            Gpu::cfg((grid(d.t * n), 1, 1), 256),
            &args![q, qb_p, rows, qk, dq],
        )?;
        let (s_i, nh, p, r, vd, dv) = (
            s_rows as i32,
            n as i32,
            d.p as i32,
            d.r as i32,
            d.v as i32,
            f.dv as i32,
        );
        self.launch(
            "fa_pack_kv",
            Gpu::cfg((grid(s_rows * n), 1, 1), 256),
            &args![k_nope, kpe, v, kb_p, vb_p, s_i, nh, p, r, vd, dq, dv],
        )?;
        Ok((qb, kb, vb))
    }

    /// The attention kernel on packed inputs ([`Gpu::fa_pack`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attn_flash_packed(
        &self,
        d: &AttnDims,
        f: &FaVariant,
        qb: &DBuf<u16>,
        kb: &DBuf<u16>,
        vb: &DBuf<u16>,
        out: u64,
        tiles: u64,
        n_tiles: usize,
        n_keys: u64,
        kv_base: u64,
    ) -> Result<()> {
        let smem = f.smem_bytes();
        self.raise_smem(f.kernel, smem)?;
        let (nh, vd) = (d.heads as i32, d.v as i32);
        let scale_log2 = d.scale * std::f32::consts::LOG2_E;
        let cfg = LaunchConfig {
            grid_dim: (n_tiles as u32, d.heads as u32, 1),
            block_dim: (32 * f.warps as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (qb, kb, vb) = (qb.ptr(), kb.ptr(), vb.ptr());
        self.launch(
            f.kernel,
            cfg,
            &args![qb, kb, vb, out, tiles, n_keys, kv_base, nh, vd, scale_log2],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_fit_the_h200_and_cover_mla_shapes() {
        for f in fa_all_variants() {
            // 1 KB of static shared memory besides (the wgmma kernels' alignment).
            assert!(f.smem_bytes() + 1024 <= 227 * 1024, "{f:?}");
            assert_eq!(f.bn % 16, 0);
            assert!(crate::kernels::NAMES.contains(&f.kernel), "{f:?}");
            assert!(f.wgmma || !FA_WGMMA_VARIANTS.contains(&f), "{f:?}");
            assert!(!f.wgmma || (f.bm() == 128 && f.dq % 64 == 0 && f.dv % 64 == 0));
        }
        assert!(FA_VARIANTS.iter().all(|f| !f.wgmma));
        assert_eq!(
            FaVariant::for_dims(192, 128).unwrap().kernel,
            "fa_fwd_d192v128"
        );
        assert_eq!(
            FaVariant::for_dims(256, 256).unwrap().kernel,
            "fa_fwd_d256_w8"
        );
        assert_eq!(FaVariant::for_dims(48, 32).unwrap().kernel, "fa_fwd_d64");
        assert_eq!(
            FaVariant::for_dims(192, 192).unwrap().kernel,
            "fa_fwd_d256_w8"
        );
        assert!(FaVariant::for_dims(320, 128).is_none());
        let on = |qk, v, arch| FaVariant::choose(qk, v, arch, true).unwrap().kernel;
        assert_eq!(on(192, 128, "sm_90a"), "fa_fwd_wg_d192v128");
        assert_eq!(on(192, 192, "sm_90a"), "fa_fwd_wg_d256");
        assert_eq!(on(192, 128, "sm_90"), "fa_fwd_d192v128");
        assert_eq!(on(192, 128, "sm_120"), "fa_fwd_d192v128");
        assert_eq!(on(48, 32, "sm_90a"), "fa_fwd_d64");
        let off = FaVariant::choose(192, 128, "sm_90a", false).unwrap();
        assert_eq!(off.kernel, "fa_fwd_d192v128");
    }

    #[test]
    fn tiles_stay_inside_sequences_heaviest_first() {
        // Sequences of 70 and 3 tokens; the second has 100 cached positions.
        let mut n_keys: Vec<i32> = (1..=70).collect();
        n_keys.extend([101, 102, 103]);
        let t = fa_tiles(&[(0, 70), (70, 73)], &n_keys, 64);
        assert_eq!(t, vec![70, 3, 64, 6, 0, 64]);
        // A zero tile height is taken as one token per tile, not an endless loop.
        assert_eq!(fa_tiles(&[(0, 2)], &[1, 2], 0), vec![1, 1, 0, 1]);
    }
}
