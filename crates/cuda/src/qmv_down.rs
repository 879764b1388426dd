//! One token's quantized MoE down projection in one launch ([`Gpu::qmv_down_comb`],
//! `kernels/qmv_down.cu`): the routed pairs' down GEMVs, their weighted combine and the
//! shared expert's down, where the one-token chain ran two launches — [`Gpu::qmv_pairs`]
//! into a [pairs, hidden] f32 scratch, then [`Gpu::qmv_combine`] (the shared down with the
//! combine in its epilogue). bf16 experts have done this since session 7 (`moe_gemv_combine`).
//!
//! Invariants: `out` ends bit for bit as those two launches leave it (every item's sums are the
//! wide one-vector kernels' — the same 16-byte words a lane a step, the same step order, the
//! same warp sum — and the epilogue adds them in `_comb`'s order), so the fused launch is
//! taken only where those two would run on the wide kernels ([`Gpu::down_comb_fits`]). The
//! routed and the shared matrices may be of different block types (the Q4_K V2-Lite model's
//! routed down is Q8_0 at K = 1,408, its shared down Q4_K). Two kernels: 8 rows a block of 8
//! warps ([`QmvDown::R8`]) or 16 rows of 16 warps ([`QmvDown::R16`]: each block quantizes act
//! for twice the rows). A lab knob, off: `MLASERVE_QMV_DOWN1=1` (R8) or `=16` (R16). Timed
//! on an H100 (session 48, bench/cuda/v2lite.md) it is no faster than the two launches
//! (7.9-8.5 µs a launch in the Q4_K V2-Lite step against 8.7): each block quantizes all of
//! act after its wait, 44-57 µs a step, with little of its weights in flight meanwhile —
//! hence the L2 prefetch of each warp's later rows before the wait ([`down1_prefetch`]),
//! not yet timed.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::Gpu;
use crate::qgemv::{QMat, QType, QMV_MAX_K};
use cudarc::driver::LaunchConfig;

/// The fused kernel's block: rows a block and warps (qmv_down.cu's QMV_DOWN_COMB2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QmvDown {
    /// 8 rows, 8 warps, two blocks an SM.
    R8,
    /// 16 rows, 16 warps, one block an SM.
    R16,
}

impl QmvDown {
    pub const ALL: [QmvDown; 2] = [QmvDown::R8, QmvDown::R16];

    fn rows(self) -> usize {
        match self {
            QmvDown::R8 => 8,
            QmvDown::R16 => 16,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            QmvDown::R8 => "",
            QmvDown::R16 => "_r16",
        }
    }
}

/// The routed side of [`Gpu::qmv_down_comb`]: one token's `k` pairs, routed expert ids `ids`
/// [k] (i32; index ids[j] - first into `w_ptrs` [held] pointers to [rows, f] down matrices of
/// `ty`; an id not held, or a null pointer, adds zeros) and their weights `w` [k] (f32).
#[derive(Clone, Copy, Debug)]
pub struct DownPairs {
    pub ty: QType,
    pub w_ptrs: u64,
    pub first: usize,
    pub held: usize,
    pub ids: u64,
    pub w: u64,
    pub k: usize,
    pub f: usize,
}

/// `MLASERVE_QMV_DOWN1=1` / `=16` (read once): the executor takes [`Gpu::qmv_down_comb`] on
/// that kernel where it fits. Off: no faster than the two launches it replaces (module doc).
pub fn down1_kernel() -> Option<QmvDown> {
    static ON: std::sync::OnceLock<Option<QmvDown>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("MLASERVE_QMV_DOWN1").as_deref() {
        Ok("1") => Some(QmvDown::R8),
        Ok("16") => Some(QmvDown::R16),
        _ => None,
    })
}

/// `MLASERVE_QMV_DOWN1_PF=0` (read once): the fused kernel does not prefetch its warps' later
/// rows into L2 before its wait (flags bit 2; on by default). A timing lab: the sums are the
/// same either way.
pub fn down1_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_DOWN1_PF").as_deref() != Ok("0"))
}

/// Dynamic shared memory of the fused kernel `v`: act quantized (`n` int8 and two f32 per
/// 32), the item sums [k + 1][rows a block] f32 and the slots' matrices [k + 1] u64.
fn smem(v: QmvDown, k: usize, f: usize, fs: usize) -> usize {
    let n = k * f + fs;
    n + n / 32 * 8 + (k + 1) * v.rows() * 4 + (k + 1) * 8
}

impl Gpu {
    /// Whether [`Gpu::qmv_down_comb`] runs `p` beside the shared down `shared` [rows, fs]:
    /// 1..=32 slots, f a multiple of the routed type's block, both widths at most the GEMV's,
    /// its shared memory here, and the two launches it replaces on the wide one-vector
    /// kernels (`MLASERVE_QMV_WIDE`, `MLASERVE_QMV_COMBINE` on, [`Gpu::combine_fits`]).
    pub fn down_comb_fits(&self, p: &DownPairs, shared: &QMat, v: QmvDown) -> bool {
        (1..=32).contains(&p.k)
            && p.f > 0
            && p.f.is_multiple_of(p.ty.block_values())
            && p.f <= QMV_MAX_K
            && shared.cols <= QMV_MAX_K
            && shared.rows > 0
            && self.combine_fits(shared, 1, p.k)
            && smem(v, p.k, p.f, shared.cols) <= self.max_smem_per_block
    }

    /// `out[r] = (out[r] + sum_j p.w[j] * (W_{ids[j]}[r, :] . act[j, :f])) + shared[r, :] .
    /// act[k, :fs]` for one token, `act` bf16 [k f + fs] (the routed pairs' SwiGLU rows, then
    /// the shared expert's intermediate: the slices' rows of the gate|up GEMV over pairs),
    /// `out` f32 [rows]: bit for bit [`Gpu::qmv_pairs`] over the pairs then
    /// [`Gpu::qmv_combine`] of `shared` with their rows, in one launch. `ids_final`: as
    /// [`Gpu::qmv_pairs_after`] (the gate|up GEMV over the same ids ran just before): the
    /// matrices are looked up and their first steps requested before the wait.
    pub fn qmv_down_comb(
        &self,
        p: DownPairs,
        shared: &QMat,
        act: u64,
        out: u64,
        ids_final: bool,
        v: QmvDown,
    ) -> Result<()> {
        if !self.down_comb_fits(&p, shared, v) {
            return Err(CudaError::Invalid(format!(
                "qmv_down_comb: {k} slots of {ty:?} [{rows} x {f}] beside a shared {sty:?} \
                 [{rows} x {fs}] (1..=32 slots, widths multiples of the block and at most \
                 {QMV_MAX_K}, {smem} bytes of shared memory of {max}, the shared down on the \
                 one-vector GEMV)",
                k = p.k,
                ty = p.ty,
                rows = shared.rows,
                f = p.f,
                sty = shared.ty,
                fs = shared.cols,
                smem = smem(v, p.k, p.f, shared.cols),
                max = self.max_smem_per_block,
            )));
        }
        let (tag, sfx) = (p.ty.tag(), v.suffix());
        let name = format!("qmv_down_comb_{tag}_{}{sfx}", shared.ty.tag());
        let smem = smem(v, p.k, p.f, shared.cols);
        let threads = 32 * v.rows(); // as many warps as rows
        if smem > 48 << 10 {
            // (opts the kernel in once; cached)
            self.resident_ctas(&name, threads, smem)?;
        }
        let cfg = LaunchConfig {
            grid_dim: (shared.rows.div_ceil(v.rows()) as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (first, held, k) = (p.first as i32, p.held as i32, p.k as i32);
        let (f, fs, rows) = (p.f as i32, shared.cols as i32, shared.rows as i32);
        let ws = shared.w.ptr();
        let flags = ((ids_final && crate::qgemv::pairs_early()) as i32) << 1
            | (down1_prefetch() as i32) << 2;
        self.launch(
            &name,
            cfg,
            &args![p.w_ptrs, first, held, p.ids, k, p.w, act, f, ws, fs, rows, out, flags],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_the_kernels() {
        for v in QmvDown::ALL {
            let (r, sfx) = (v.rows(), v.suffix());
            let def = format!("QMV_DOWN_COMB(TAN, TA, TBN, TB, {sfx}, {r}, {r}, ");
            assert!(crate::kernels::SOURCE.contains(&def), "qmv_down.cu: {def}");
            for (a, b) in [
                ("q8_0", "q8_0"),
                ("q8_0", "q4_k"),
                ("q4_k", "q4_k"),
                ("q4_k", "q8_0"),
            ] {
                let name = format!("qmv_down_comb_{a}_{b}{sfx}");
                assert!(crate::kernels::NAMES.contains(&name.as_str()), "{name}");
            }
        }
    }

    #[test]
    fn shared_memory_of_the_v2_lite_layer() {
        // 8,448 + 2,816 int8 of act, 352 blocks' d and d * sum, 7 x 8 sums, 7 pointers
        let sm = smem(QmvDown::R8, 6, 1408, 2816);
        assert_eq!(sm, 11_264 + 352 * 8 + 7 * 8 * 4 + 7 * 8);
    }
}
