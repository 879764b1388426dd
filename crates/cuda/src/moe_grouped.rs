//! MoE past the GEMV path without a host round trip (`kernels/moe_grouped.cu`): the routed
//! (token, slot) pairs are sorted by expert on the GPU ([`Gpu::moe_sort`]) and each projection
//! is one grouped tensor-core GEMM launch over all experts ([`Gpu::moe_gemm`]), which reads an
//! expert's weights once per 16 of its rows.
//!
//! Invariants: the sort is stable (rows of an expert in pair order), so results do not
//! depend on scheduling; launch configurations depend only on the pair count (the GEMM grid
//! has room for the most m-tiles any routing can need, [`moe_max_tiles`]), so decode steps
//! using it can be captured in CUDA graphs. Needs sm_80 (bf16 mma, cp.async), at most
//! [`MOE_SORT_MAX_PAIRS`] pairs and 1024 held experts, and k % 8 == 0.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::Gpu;
use cudarc::driver::LaunchConfig;

/// Most pairs (tokens × top-k) one sort takes (its shared-memory copy of the ids).
pub const MOE_SORT_MAX_PAIRS: usize = 8192;
const BM: usize = 16;
const BN: usize = 128;
const SMEM: usize = 4 * (16 + 128) * 72 * 2;

/// M-tiles the GEMM grid provides for `pairs` rows over `held` experts: each expert's rows
/// round up to whole 16-row tiles, so at most ceil(pairs / 16) + held.
pub fn moe_max_tiles(pairs: usize, held: usize) -> usize {
    pairs.div_ceil(BM) + held.min(pairs)
}

impl Gpu {
    /// Stable sort of `pairs` expert ids [P] (global expert numbers; experts outside
    /// first..first+held dropped) → order [P], pos [P] (-1 if dropped), offsets [held + 1],
    /// tile_off [held + 1] (i32).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_sort(
        &self,
        pairs: usize,
        ids: u64,
        first: usize,
        held: usize,
        order: u64,
        pos: u64,
        offsets: u64,
        tile_off: u64,
    ) -> Result<()> {
        if pairs > MOE_SORT_MAX_PAIRS || held > 1024 || held == 0 {
            return Err(CudaError::Invalid(format!(
                "GPU expert sort takes 1-1024 experts and <= {MOE_SORT_MAX_PAIRS} pairs, got {held} / {pairs}"
            )));
        }
        let (p, f, h) = (pairs as i32, first as i32, held as i32);
        self.launch(
            "moe_sort",
            Gpu::cfg((1, 1, 1), 1024),
            &args![ids, p, f, h, order, pos, offsets, tile_off],
        )
    }

    /// Grouped expert GEMM over the sorted rows of [`Gpu::moe_sort`]: out[r, :n] =
    /// W_e[:n, :k] · x[src(r), :k] for every held expert e and row r of e, src(r) =
    /// order[r] / x_div when `gather` else r. `w_ptrs` [held] bf16 [n, k] matrices;
    /// x bf16; out f32 [pairs, n] (rows of dropped pairs untouched).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm(
        &self,
        pairs: usize,
        held: usize,
        w_ptrs: u64,
        order: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        offsets: u64,
        tile_off: u64,
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
        self.raise_smem("moe_gemm", SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(BN) as u32, moe_max_tiles(pairs, held) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: SMEM as u32,
        };
        let (xd, ga, h, n32, k32) = (x_div as i32, gather as i32, held as i32, n as i32, k as i32);
        self.launch(
            "moe_gemm",
            cfg,
            &args![w_ptrs, order, x, xd, ga, offsets, tile_off, h, n32, k32, out],
        )
    }
}
