//! MoE past the GEMV path without a host round trip (`kernels/moe_grouped.cu`): the routed
//! (token, slot) pairs are sorted by expert on the GPU ([`Gpu::moe_sort`]) and each projection
//! is one grouped tensor-core GEMM launch over all experts ([`Gpu::moe_gemm`]), which reads an
//! expert's weights once per 16 of its rows, or per 64 when the experts average 32 rows or
//! more ([`moe_tile_rows`]).
//!
//! Invariants: the sort is stable (rows of an expert in pair order), so results do not
//! depend on scheduling; launch configurations depend only on the pair count (the GEMM grid
//! has room for the most m-tiles any routing can need, [`moe_max_tiles`]), so decode steps
//! using it can be captured in CUDA graphs. Needs sm_80 (bf16 mma, cp.async), at most
//! [`MOE_SORT_MAX_PAIRS`] pairs and 1024 held experts, and k % 8 == 0.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use cudarc::driver::LaunchConfig;

/// Most pairs (tokens × top-k) one sort takes (its shared-memory copy of the ids).
pub const MOE_SORT_MAX_PAIRS: usize = 16384;
const BN: usize = 128;

/// Rows per GEMM block for `pairs` rows over `held` experts: 64 (moe_gemm_m4) when the
/// experts average 32 rows or more, else 16 (moe_gemm). A function of the shape only.
pub fn moe_tile_rows(pairs: usize, held: usize) -> usize {
    if pairs >= 32 * held.max(1) {
        64
    } else {
        16
    }
}

/// M-tiles the GEMM grid provides: each expert's rows round up to whole tiles of `bm`, so
/// at most ceil(pairs / bm) + (experts with rows).
pub fn moe_max_tiles(pairs: usize, held: usize, bm: usize) -> usize {
    pairs.div_ceil(bm) + held.min(pairs)
}

fn gemm_smem(bm: usize) -> usize {
    4 * (bm + BN) * 72 * 2
}

/// Pairs sorted by expert on the device ([`Gpu::moe_sort`]), i32 each: order [P] (pairs in
/// sorted order; the first offsets[held] valid), pos [P] (sorted row of each pair, -1 if its
/// expert is not held), offsets [held + 1], tile_off [held + 1] (m-tiles of
/// [`moe_tile_rows`] before each expert).
pub struct SortedPairs {
    pub pairs: usize,
    pub held: usize,
    pub order: DBuf<i32>,
    pub pos: DBuf<i32>,
    pub offsets: DBuf<i32>,
    pub tile_off: DBuf<i32>,
}

impl Gpu {
    /// Stable sort of `pairs` expert ids [P] (global expert numbers; experts outside
    /// first..first+held dropped).
    pub fn moe_sort(
        &self,
        pairs: usize,
        ids: u64,
        first: usize,
        held: usize,
    ) -> Result<SortedPairs> {
        if pairs > MOE_SORT_MAX_PAIRS || held > 1024 || held == 0 {
            return Err(CudaError::Invalid(format!(
                "GPU expert sort takes 1-1024 experts and <= {MOE_SORT_MAX_PAIRS} pairs, got {held} / {pairs}"
            )));
        }
        let s = SortedPairs {
            pairs,
            held,
            order: self.alloc(pairs)?,
            pos: self.alloc(pairs)?,
            offsets: self.alloc(held + 1)?,
            tile_off: self.alloc(held + 1)?,
        };
        self.raise_smem("moe_sort", MOE_SORT_MAX_PAIRS * 4)?;
        let bm = moe_tile_rows(pairs, held) as i32;
        let (p, f, h) = (pairs as i32, first as i32, held as i32);
        let (o, ps, off, to) = (
            s.order.ptr(),
            s.pos.ptr(),
            s.offsets.ptr(),
            s.tile_off.ptr(),
        );
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: (pairs.max(1) * 4) as u32,
        };
        self.launch("moe_sort", cfg, &args![ids, p, f, h, bm, o, ps, off, to])?;
        Ok(s)
    }

    /// Grouped expert GEMM over the sorted rows of `s`: out[r, :n] = W_e[:n, :k] · x[src(r), :k]
    /// for every held expert e and row r of e, src(r) = order[r] / x_div when `gather` else r.
    /// `w_ptrs` [held] bf16 [n, k] matrices; x bf16; out f32 [pairs, n] (rows of dropped
    /// pairs untouched).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm(
        &self,
        s: &SortedPairs,
        w_ptrs: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        n: usize,
        k: usize,
        out: u64,
    ) -> Result<()> {
        if k % 8 != 0 || !self.has_flash_attn() {
            return Err(CudaError::Invalid(format!(
                "grouped expert GEMM needs k % 8 == 0 and sm_80+, got k={k} on {}",
                self.arch
            )));
        }
        let bm = moe_tile_rows(s.pairs, s.held);
        let (name, smem) = match bm {
            64 => ("moe_gemm_m4", gemm_smem(64)),
            _ => ("moe_gemm", gemm_smem(16)),
        };
        self.raise_smem(name, smem)?;
        let cfg = LaunchConfig {
            grid_dim: (
                n.div_ceil(BN) as u32,
                moe_max_tiles(s.pairs, s.held, bm) as u32,
                1,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (o, off, to) = (s.order.ptr(), s.offsets.ptr(), s.tile_off.ptr());
        let (xd, ga, h) = (x_div as i32, gather as i32, s.held as i32);
        let (n32, k32) = (n as i32, k as i32);
        self.launch(
            name,
            cfg,
            &args![w_ptrs, o, x, xd, ga, off, to, h, n32, k32, out],
        )
    }
}
