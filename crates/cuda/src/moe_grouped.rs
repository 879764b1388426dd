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
use crate::qgemv::{QMat, QType};
use cudarc::driver::LaunchConfig;

/// Most pairs (tokens × top-k) one sort takes (its shared-memory copy of the ids).
pub const MOE_SORT_MAX_PAIRS: usize = 16384;
const BN: usize = 128;

/// Rows per GEMM m-tile for `pairs` rows over `held` experts: 64 (moe_gemm_m4, or on sm_90a
/// for bf16 the wgmma kernels) when the experts average 32 rows or more, else 16 (moe_gemm).
/// A function of the shape only.
pub fn moe_tile_rows(pairs: usize, held: usize) -> usize {
    if pairs >= 32 * held.max(1) {
        64
    } else {
        16
    }
}

/// Features a block of the wgmma grouped GEMMs (`moe_gemm_wg`, `moe_gemm_wg2`).
const WG_BN: usize = 256;

/// The wgmma grouped GEMM for bf16 experts in 64-row tiles on `arch`, and its shared memory
/// (its stages — wg2: 4 of x [128][64] and W [256][64] bf16; wg: 5 of x [64][64] and W — and
/// 1 KB to align them to 1024 bytes): `moe_gemm_wg2` (two m-tiles a block: 1.4x `moe_gemm_wg`
/// in run 5, 2.5-2.8x `moe_gemm_m4` a call in V2-Lite's prefill since run 6, bench/cuda/v2lite.md);
/// None off sm_90a or with `MLASERVE_MOE_WGMMA=0`; `=1`: `moe_gemm_wg` (comparisons).
fn moe_wgmma(arch: &str) -> Option<(&'static str, usize)> {
    static PICK: std::sync::OnceLock<Option<(&'static str, usize)>> = std::sync::OnceLock::new();
    if arch != "sm_90a" {
        return None;
    }
    *PICK.get_or_init(|| match std::env::var("MLASERVE_MOE_WGMMA").as_deref() {
        Ok("0") => None,
        Ok("1") => Some(("moe_gemm_wg", 5 * (64 + WG_BN) * 128 + 1024)),
        _ => Some(("moe_gemm_wg2", 4 * (128 + WG_BN) * 128 + 1024)),
    })
}

/// M-tiles the GEMM grid provides: each expert's rows round up to whole tiles of `bm`, so
/// at most ceil(pairs / bm) + (experts with rows).
pub fn moe_max_tiles(pairs: usize, held: usize, bm: usize) -> usize {
    pairs.div_ceil(bm) + held.min(pairs)
}

/// Dynamic shared memory of a grouped-GEMM block: the x ring, and the bf16 weight ring, or
/// for quantized weights one bf16 tile + the ring of raw slices (`MOE_RAW_*` bytes a row).
fn gemm_smem(bm: usize, wty: Option<QType>) -> usize {
    const STAGES: usize = 4;
    const ROW: usize = 72 * 2;
    let a = STAGES * bm * ROW;
    match wty {
        None => a + STAGES * BN * ROW,
        Some(t) => {
            let raw = match t {
                QType::Q8_0 => 80,
                QType::Q4K => 48,
            };
            a + BN * ROW + STAGES * BN * raw
        }
    }
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
    /// `w_ptrs` [held] [n, k] matrices, bf16 (`wty` None) or quantized (qgemv.rs layouts); x
    /// bf16; out f32 [pairs, n], 8-byte aligned (rows of dropped pairs untouched). Quantized experts with
    /// k % 256 == 0 go to the int8 tensor-core kernel over x quantized to int8 (Q8_0 per 32
    /// values, Q4_K by `qmmq::x_q8u`; [`Gpu::moe_mmq`]; `MLASERVE_QMMQ=0`: never), bf16 experts in
    /// 64-row tiles on sm_90a to [`Gpu::moe_gemm_wg`], others to [`Gpu::moe_gemm_tiles`].
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm(
        &self,
        s: &SortedPairs,
        wty: Option<QType>,
        w_ptrs: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        n: usize,
        k: usize,
        out: u64,
    ) -> Result<()> {
        if let Some(t) = wty.filter(|_| self.moe_mmq_fits(k)) {
            return self.moe_mmq(s, t, w_ptrs, x, x_div, gather, n, k, out);
        }
        if wty.is_none() && moe_tile_rows(s.pairs, s.held) == 64 && moe_wgmma(self.arch).is_some() {
            return self.moe_gemm_wg(s, w_ptrs, x, x_div, gather, n, k, out);
        }
        self.moe_gemm_tiles(s, wty, w_ptrs, x, x_div, gather, n, k, out)
    }

    /// Whether [`Gpu::moe_gemm_glu`] takes `pairs` rows over `held` bf16 experts: 64-row
    /// tiles on sm_90a with `moe_gemm_wg2` picked, unless `MLASERVE_MOE_GLU=0`.
    pub fn moe_glu_fits(&self, pairs: usize, held: usize) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var("MLASERVE_MOE_GLU").map_or(true, |v| v != "0"))
            && moe_tile_rows(pairs, held) == 64
            && moe_wgmma(self.arch).is_some_and(|(name, _)| name == "moe_gemm_wg2")
    }

    /// The gate|up product of bf16 experts with the SwiGLU in its epilogue (`moe_gemm_wg2_glu`):
    /// act[r, :f] = bf16(silu(g) * u), (g, u) = the rows 0..f and f..2f of W_e [2f, k] times
    /// x[src(r)] — what [`Gpu::moe_gemm`] into f32 [pairs, 2f] then `silu_mul` give.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm_glu(
        &self,
        s: &SortedPairs,
        w_ptrs: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        f: usize,
        k: usize,
        act: u64,
    ) -> Result<()> {
        if !k.is_multiple_of(8) || !self.moe_glu_fits(s.pairs, s.held) {
            return Err(CudaError::Invalid(format!(
                "moe_gemm_glu needs k % 8 == 0, 64-row tiles, sm_90a, moe_gemm_wg2 and not MLASERVE_MOE_GLU=0, got k={k}, {} pairs of {} experts, {}",
                s.pairs, s.held, self.arch
            )));
        }
        let (_, smem) = moe_wgmma(self.arch).expect("moe_glu_fits: wg2 picked");
        let blocks = f.div_ceil(WG_BN / 2);
        self.launch_wg(
            "moe_gemm_wg2_glu",
            smem,
            blocks,
            s,
            w_ptrs,
            x,
            x_div,
            gather,
            f,
            k,
            act,
        )
    }

    /// [`Gpu::moe_gemm_tiles`] for bf16 experts in 64-row tiles on sm_90a's warpgroup MMA
    /// (`moe_gemm_wg`: 64 x 256 a block, two warpgroups; `moe_gemm_wg2`: 128 x 256; the same
    /// sums to f32 rounding, in the tensor core's order within a 16-wide k-step).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm_wg(
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
        let bm = moe_tile_rows(s.pairs, s.held);
        let picked = moe_wgmma(self.arch);
        let Some((name, smem)) = picked.filter(|_| k.is_multiple_of(8) && bm == 64) else {
            return Err(CudaError::Invalid(format!(
                "the wgmma grouped GEMM needs k % 8 == 0, 64-row tiles and sm_90a (and not MLASERVE_MOE_WGMMA=0), got k={k}, {bm} rows, {}",
                self.arch
            )));
        };
        let blocks = n.div_ceil(WG_BN);
        self.launch_wg(name, smem, blocks, s, w_ptrs, x, x_div, gather, n, k, out)
    }

    /// One launch of a wgmma grouped-GEMM kernel (`moe_gemm_wg`, `moe_gemm_wg2`,
    /// `moe_gemm_wg2_glu`: the same arguments, `n` and `out` the glu's f and act): `blocks`
    /// column blocks x the m-tiles any routing of `s` can need (64-row tiles), 256 threads.
    #[allow(clippy::too_many_arguments)]
    fn launch_wg(
        &self,
        name: &'static str,
        smem: usize,
        blocks: usize,
        s: &SortedPairs,
        w_ptrs: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        n: usize,
        k: usize,
        out: u64,
    ) -> Result<()> {
        self.raise_smem(name, smem)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, moe_max_tiles(s.pairs, s.held, 64) as u32, 1),
            block_dim: (256, 1, 1),
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

    /// [`Gpu::moe_gemm`] on the bf16 mma.sync tensor-core kernel: quantized weights
    /// dequantized tile by tile in shared memory (the products of a bf16 upload on this
    /// kernel, bit for bit).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm_tiles(
        &self,
        s: &SortedPairs,
        wty: Option<QType>,
        w_ptrs: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        n: usize,
        k: usize,
        out: u64,
    ) -> Result<()> {
        let align = wty.map_or(8, |t| t.block_values());
        if !k.is_multiple_of(align) || !self.has_flash_attn() {
            return Err(CudaError::Invalid(format!(
                "grouped expert GEMM over {wty:?} needs k % {align} == 0 and sm_80+, got k={k} on {}",
                self.arch
            )));
        }
        let bm = moe_tile_rows(s.pairs, s.held);
        let (o, off, to) = (s.order.ptr(), s.offsets.ptr(), s.tile_off.ptr());
        let (xd, ga, h) = (x_div as i32, gather as i32, s.held as i32);
        let (n32, k32) = (n as i32, k as i32);
        let smem = gemm_smem(bm, wty);
        let name = gemm_kernel(wty, bm);
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
        let zero = 0i32;
        self.launch(
            name,
            cfg,
            &args![w_ptrs, o, x, xd, ga, off, to, h, n32, k32, out, zero, zero],
        )
    }

    /// out[m, :rows] (+)= x[m, :cols] . W^T for one quantized matrix and 1 <= m <= 64 rows of
    /// x (bf16), on the grouped GEMM's tensor-core kernel in dense mode: weight tiles
    /// dequantized in shared memory, every weight read once (one m-tile of 16 or 64 rows).
    pub fn qgemm_tc(&self, w: &QMat, m: usize, x: u64, out: u64, accumulate: bool) -> Result<()> {
        if !self.has_flash_attn() || m == 0 || m > 64 || !w.cols.is_multiple_of(w.ty.block_values())
        {
            return Err(CudaError::Invalid(format!(
                "qgemm_tc: {m} rows of {:?} [{} x {}] on {} (1-64 rows, sm_80+)",
                w.ty, w.rows, w.cols, self.arch
            )));
        }
        let bm = if m <= 16 { 16 } else { 64 };
        let (name, smem) = (gemm_kernel(Some(w.ty), bm), gemm_smem(bm, Some(w.ty)));
        self.raise_smem(name, smem)?;
        // Split K until the grid has ~6 blocks per SM (a block is 4 warps, and its per-step
        // dequantize + barrier chain needs other blocks to hide it; each split keeps >= 4 K
        // steps); the partial sums are added in split order by qgemm_reduce.
        let nblk = w.rows.div_ceil(BN);
        let ksteps = w.cols.div_ceil(64);
        let splits = (6 * self.sm_count)
            .div_ceil(nblk)
            .min(ksteps / 4)
            .clamp(1, 32);
        let cfg = LaunchConfig {
            grid_dim: (nblk as u32, 1, splits as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (null, one, zero) = (0u64, 1i32, 0i32);
        let (n32, k32, m32, acc) = (w.rows as i32, w.cols as i32, m as i32, accumulate as i32);
        let p = w.ptr.ptr();
        if splits == 1 {
            return self.launch(
                name,
                cfg,
                &args![p, null, x, one, zero, null, null, zero, n32, k32, out, m32, acc],
            );
        }
        let mn = m * w.rows;
        let part = self.alloc::<f32>(splits * mn)?;
        let pp = part.ptr();
        self.launch(
            name,
            cfg,
            &args![p, null, x, one, zero, null, null, zero, n32, k32, pp, m32, zero],
        )?;
        let (sp, mn64) = (splits as i32, mn as i64);
        let grid = mn.div_ceil(256).min(4096) as u32;
        self.launch(
            "qgemm_reduce",
            Gpu::cfg((grid, 1, 1), 256),
            &args![pp, sp, mn64, acc, out],
        )
    }
}

/// The grouped-GEMM kernel for weights `wty` and `bm`-row tiles.
pub(crate) fn gemm_kernel(wty: Option<QType>, bm: usize) -> &'static str {
    match (wty, bm) {
        (None, 64) => "moe_gemm_m4",
        (None, _) => "moe_gemm",
        (Some(QType::Q8_0), 64) => "moe_gemm_q8_0_m4",
        (Some(QType::Q8_0), _) => "moe_gemm_q8_0",
        (Some(QType::Q4K), 64) => "moe_gemm_q4_k_m4",
        (Some(QType::Q4K), _) => "moe_gemm_q4_k",
    }
}
