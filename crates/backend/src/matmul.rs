//! The matmul driver: activation conversion, tiling and threads.
//!
//! `out[t, r] = Σ_c x[t, c] · W[r, c]`. The activation rows are converted once to the weight
//! type's vec_dot type (read in place where that is f32: F32 weights and
//! `QMatrix::with_f32_activations`); then the `[n_tokens, rows]` output is cut into tiles of
//! `ROW_TILE` rows × `TOKEN_BLOCK` tokens (`ROW_TILE_FEW` rows × all tokens where there are
//! at most 4), which run in parallel (on the calling thread's
//! [`crate::team`] where it leads one, else on rayon's pool) and write disjoint output
//! elements. Inside a tile the columns are walked in chunks (`k_chunk`); for
//! each chunk and each group of 4 tokens (their activation chunks stay in L1) the tile's
//! weight rows meet the group through one row-kernel call, which unpacks each weight block
//! once for the 4 tokens. Partial sums of the chunks are added in column order.
//! `matmul_batch` runs the tiles of several products in one parallel loop.
//!
//! Invariant: a token's outputs do not depend on which other tokens share the call — the
//! chunking depends on the weight only, every kernel keeps one accumulator per token, and
//! the f32-activation kernels for ≤ 4 tokens add in the order of the dequantized tiles'
//! kernel beyond — so batched and one-at-a-time results are bit-identical (tested).

use crate::act::{quantize_act_row_with, ActType};
use crate::isa::Isa;
use crate::kernels::{dequantize_with, dequantized_tile_kernel, f32_act_row_kernel, row_kernel};
use crate::qmatrix::QMatrix;
use mlaserve_gguf::GgmlType;
use rayon::prelude::*;
use std::cell::Cell;

/// Rows per tile of a call with more than [`GROUP`] tokens.
const ROW_TILE: usize = 16;
/// Rows per tile of a call with at most [`GROUP`] tokens (a decode step): such a tile holds
/// little work a row, so more rows a tile keep the per-tile cost (the plan lookup, the
/// accumulators, the team's claim) small against the kernel's.
const ROW_TILE_FEW: usize = 64;
/// Tokens per tile (when there are more than [`GROUP`]).
const TOKEN_BLOCK: usize = 64;
/// Tokens per row-kernel call: the kernels unpack each weight block once for this many.
const GROUP: usize = 4;
/// Activation bytes per token per column chunk: `GROUP` tokens' chunks stay in L1 while the
/// tile's weight rows stream past them.
const ACT_CHUNK_BYTES: usize = 4608;
/// Below this many weight bytes × tokens a matmul runs on the calling thread.
const PARALLEL_MIN_WORK: usize = 64 * 1024;

thread_local! {
    /// Reused activation buffer of the calling thread (taken while in use, so a nested call
    /// from inside a rayon task simply allocates its own).
    static ACT_SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// `out[t, r] = Σ_c x[t, c] · W[r, c]`; `x: [n_tokens, cols]`, `out: [n_tokens, rows]`
/// (overwritten). Uses the best instruction set of this CPU.
///
/// # Panics
/// If `x` or `out` does not have the length the shapes imply.
pub fn matmul(x: &[f32], n_tokens: usize, w: &QMatrix, out: &mut [f32]) {
    matmul_with(Isa::detect(), x, n_tokens, w, out)
}

/// [`matmul`] with the kernels of instruction-set level `isa` (a level this CPU lacks falls
/// back to [`Isa::Scalar`]). For testing levels against each other.
pub fn matmul_with(isa: Isa, x: &[f32], n_tokens: usize, w: &QMatrix, out: &mut [f32]) {
    matmul_batch_with(
        isa,
        &mut [MatmulJob {
            x,
            n_tokens,
            w,
            out,
        }],
    )
}

/// One product of a [`matmul_batch`]: `out[t, r] = Σ_c x[t, c] · w[r, c]`, `x: [n_tokens,
/// w.cols]`, `out: [n_tokens, w.rows]` (overwritten).
pub struct MatmulJob<'a> {
    /// Activations `[n_tokens, w.cols]`.
    pub x: &'a [f32],
    /// Activation rows.
    pub n_tokens: usize,
    /// The weight.
    pub w: &'a QMatrix,
    /// Output `[n_tokens, w.rows]`.
    pub out: &'a mut [f32],
}

/// Several independent matmuls in one parallel region (a grouped GEMM): the experts of a MoE
/// layer, gate and up of a SwiGLU, the per-head products of the absorbed attention. Each
/// job's outputs are bit for bit those of [`matmul`] on it alone (the same tiles and
/// chunks); jobs whose `x` is the same slice and whose weights take the same activation type
/// share one conversion of it. One fork-join for the batch instead of one a product.
///
/// # Panics
/// If a job's `x` or `out` does not have the length its shapes imply.
pub fn matmul_batch(jobs: &mut [MatmulJob]) {
    matmul_batch_with(Isa::detect(), jobs)
}

/// [`matmul_batch`] at instruction-set level `isa` (see [`matmul_with`]).
pub fn matmul_batch_with(isa: Isa, jobs: &mut [MatmulJob]) {
    let isa = if isa.is_available() { isa } else { Isa::Scalar };
    for j in jobs.iter() {
        j.w.assert_consistent();
        assert_eq!(
            j.x.len(),
            j.n_tokens * j.w.cols,
            "matmul: x has {} values, expected [{} x {}]",
            j.x.len(),
            j.n_tokens,
            j.w.cols
        );
        assert_eq!(
            j.out.len(),
            j.n_tokens * j.w.rows,
            "matmul: out has {} values, expected [{} x {}]",
            j.out.len(),
            j.n_tokens,
            j.w.rows
        );
    }
    let work: usize = jobs
        .iter()
        .map(|j| j.w.rows * j.w.row_bytes() * j.n_tokens)
        .sum();
    let parallel = work >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1;

    // Activations: f32 rows are read in place; the others are converted once per distinct
    // (x, type), the first job with it converting, into one scratch buffer.
    let mut scratch = ACT_SCRATCH.with(|c| c.take());
    scratch.clear();
    // Per job: its activations' offset in `scratch` (None: read `x` in place), and whether it
    // converts them.
    let mut act_at: Vec<Option<(usize, bool)>> = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let act = act_type(j.w);
        if act == ActType::F32 || j.n_tokens == 0 {
            act_at.push(None);
            continue;
        }
        let same = |k: &MatmulJob| {
            std::ptr::eq(k.x, j.x) && act_type(k.w) == act && k.n_tokens == j.n_tokens
        };
        let at = match jobs[..i].iter().zip(&act_at).find(|(k, _)| same(k)) {
            Some((_, Some((off, _)))) => (*off, false),
            _ => {
                let off = scratch.len();
                scratch.resize(off + j.n_tokens * act.row_bytes(j.w.cols), 0);
                (off, true)
            }
        };
        act_at.push(Some(at));
    }
    for (j, at) in jobs.iter().zip(&act_at) {
        let Some((off, true)) = *at else { continue };
        let act = act_type(j.w);
        let stride = act.row_bytes(j.w.cols);
        let dst = &mut scratch[off..off + j.n_tokens * stride];
        let rows = dst
            .chunks_exact_mut(stride.max(1))
            .zip(j.x.chunks_exact(j.w.cols.max(1)));
        if parallel && j.n_tokens >= 8 {
            rows.par_bridge()
                .for_each(|(o, xr)| quantize_act_row_with(isa, act, xr, o));
        } else {
            rows.for_each(|(o, xr)| quantize_act_row_with(isa, act, xr, o));
        }
    }

    let plans: Vec<Plan> = jobs
        .iter_mut()
        .zip(&act_at)
        .map(|(j, at)| {
            let acts: &[u8] = match at {
                Some((off, _)) => {
                    &scratch[*off..*off + j.n_tokens * act_type(j.w).row_bytes(j.w.cols)]
                }
                None => bytemuck::cast_slice(j.x),
            };
            Plan::new(isa, j.w, j.n_tokens, acts, j.out.as_mut_ptr())
        })
        .collect();
    // Tile k of the batch is tile k - first[p] of plan p.
    let mut first = Vec::with_capacity(plans.len() + 1);
    first.push(0usize);
    for p in &plans {
        first.push(first.last().unwrap() + p.n_tiles);
    }
    let n_tiles = *first.last().unwrap();
    let run = |k: usize| {
        let p = first.partition_point(|&f| f <= k) - 1;
        plans[p].run_tile(k - first[p]);
    };
    if parallel {
        // On this thread's team where it leads one (`crate::team`), else a rayon fork-join.
        if !crate::team::for_each(n_tiles, &run) {
            (0..n_tiles).into_par_iter().for_each(run);
        }
    } else {
        (0..n_tiles).for_each(run);
    }
    drop(plans);
    scratch.clear();
    ACT_SCRATCH.with(|c| c.set(scratch));
}

/// The activation type of weight `w` (every QMatrix type has one): f32 where `w` is
/// multiplied as its dequantized values.
fn act_type(w: &QMatrix) -> ActType {
    if w.has_f32_activations() {
        return ActType::F32;
    }
    ActType::for_weight(w.ty)
        .unwrap_or_else(|| unreachable!("QMatrix invariant: {} is supported", w.ty))
}

thread_local! {
    /// A tile's weight rows dequantized for one column chunk (`QMatrix::with_f32_activations`).
    static DEQ_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// One job's tiling: `[n_tokens, rows]` cut into tiles of `ROW_TILE` rows x `token_block`
/// tokens, numbered token block major.
struct Plan<'a> {
    isa: Isa,
    w: &'a QMatrix,
    /// `w`'s bytes, resolved once (row `r` at `r * row_bytes`).
    wdata: &'a [u8],
    row_bytes: usize,
    /// Whether each chunk of the tile's rows is dequantized to f32 for the f32 kernel.
    dequant: bool,
    kernel: crate::kernels::RowKernel,
    acts: &'a [u8],
    a_stride: usize,
    n_tokens: usize,
    token_block: usize,
    n_row_tiles: usize,
    n_tiles: usize,
    k_chunk: usize,
    out: SendPtr,
}

impl<'a> Plan<'a> {
    fn new(isa: Isa, w: &'a QMatrix, n_tokens: usize, acts: &'a [u8], out: *mut f32) -> Self {
        let act = act_type(w);
        // Against f32 activations: F16/BF16 kernels widen their weights; for up to `GROUP`
        // tokens a kernel dequantizing in registers where the level has one; otherwise each
        // chunk of a tile's rows is dequantized once and meets the tokens through the f32
        // kernel.
        let (dequant, kernel) = if w.has_f32_activations() {
            let direct = if n_tokens <= GROUP || matches!(w.ty, GgmlType::F16 | GgmlType::BF16) {
                f32_act_row_kernel(w.ty, isa)
            } else {
                None
            };
            match direct {
                Some(k) => (false, Some(k)),
                None if w.ty == GgmlType::F32 => (false, row_kernel(GgmlType::F32, isa)),
                None => (true, Some(dequantized_tile_kernel(isa))),
            }
        } else {
            (false, row_kernel(w.ty, isa))
        };
        let Some(kernel) = kernel else {
            unreachable!("QMatrix invariant: {} is supported", w.ty);
        };
        let token_block = if n_tokens <= GROUP {
            n_tokens
        } else {
            TOKEN_BLOCK
        };
        // As `run_tile` picks its `RT`.
        let row_tile = if token_block <= GROUP {
            ROW_TILE_FEW
        } else {
            ROW_TILE
        };
        let n_row_tiles = w.rows.div_ceil(row_tile);
        let n_tiles = if n_tokens == 0 {
            0
        } else {
            n_row_tiles * n_tokens.div_ceil(token_block)
        };
        Plan {
            isa,
            w,
            wdata: w.data(),
            row_bytes: w.row_bytes(),
            dequant,
            kernel,
            acts,
            a_stride: act.row_bytes(w.cols),
            n_tokens,
            token_block,
            n_row_tiles,
            n_tiles,
            k_chunk: k_chunk(w, act),
            out: SendPtr(out),
        }
    }

    fn run_tile(&self, i: usize) {
        if self.token_block <= GROUP {
            self.tile::<GROUP, ROW_TILE_FEW>(i)
        } else {
            self.tile::<TOKEN_BLOCK, ROW_TILE>(i)
        }
    }

    /// Tile `i` with `TB >= token_block` accumulator columns and `RT` rows (the row tile
    /// `new` counted tiles with).
    fn tile<const TB: usize, const RT: usize>(&self, i: usize) {
        let w = self.w;
        let act = act_type(w);
        let (w_bs, w_ts, a_bs, a_bb) = (
            w.ty.block_size(),
            w.ty.type_size(),
            act.block_size(),
            act.block_bytes(),
        );
        let (tb, rt) = (i / self.n_row_tiles, i % self.n_row_tiles);
        let (t0, t1) = (
            tb * self.token_block,
            ((tb + 1) * self.token_block).min(self.n_tokens),
        );
        let (r0, r1) = (rt * RT, ((rt + 1) * RT).min(w.rows));
        // acc[(r - r0) * TB + (t - t0)]
        let mut acc = [[0f32; TB]; RT];
        // The kernel's results of a group: part[(r - r0) * ng + (t - g0)].
        let mut part = [[0f32; GROUP]; RT];
        let part = part.as_flattened_mut();
        // Dequantized chunk of row r: deq[(r - r0) * k_chunk..][..k1 - k0].
        let mut deq = if self.dequant {
            let mut v = DEQ_SCRATCH.with(|c| c.take());
            v.resize(RT * self.k_chunk, 0.0);
            v
        } else {
            Vec::new()
        };
        let nr = r1 - r0;
        let mut k0 = 0;
        while k0 < w.cols {
            let k1 = (k0 + self.k_chunk).min(w.cols);
            let (wb0, ab0) = (k0 / w_bs * w_ts, k0 / a_bs * a_bb);
            if self.dequant {
                let wb1 = k1 / w_bs * w_ts;
                for r in r0..r1 {
                    let dst = &mut deq[(r - r0) * self.k_chunk..][..k1 - k0];
                    let row = &self.wdata[r * self.row_bytes..];
                    dequantize_with(self.isa, w.ty, &row[wb0..wb1], dst);
                }
            }
            let (wr, rb): (&[u8], usize) = if self.dequant {
                (bytemuck::cast_slice(&deq[..]), 4 * self.k_chunk)
            } else {
                (&self.wdata[r0 * self.row_bytes + wb0..], self.row_bytes)
            };
            for g0 in (t0..t1).step_by(GROUP) {
                let ng = GROUP.min(t1 - g0);
                let a = &self.acts[g0 * self.a_stride + ab0..];
                (self.kernel)(
                    k1 - k0,
                    wr,
                    rb,
                    nr,
                    a,
                    self.a_stride,
                    ng,
                    &mut part[..nr * ng],
                );
                for (acc_r, part_r) in acc[..nr].iter_mut().zip(part.chunks_exact(ng)) {
                    for (d, p) in acc_r[g0 - t0..][..ng].iter_mut().zip(part_r) {
                        *d += *p;
                    }
                }
            }
            k0 = k1;
        }
        if self.dequant {
            DEQ_SCRATCH.with(|c| c.set(deq));
        }
        // Token-major: a token's outputs of the tile are one contiguous run of `out`.
        for t in t0..t1 {
            for r in r0..r1 {
                // SAFETY: (t, r) lies inside [n_tokens, rows] and belongs to this tile only;
                // tiles partition the job's output, jobs own disjoint outputs (`&mut`), and
                // the output outlives the parallel loop.
                unsafe {
                    self.out
                        .get()
                        .add(t * w.rows + r)
                        .write(acc[r - r0][t - t0])
                };
            }
        }
    }
}

/// Columns per chunk: a whole number of weight and activation blocks, about
/// `ACT_CHUNK_BYTES` of one activation row. Depends only on the weight, never on the number
/// of tokens, so a token's result is bit-identical whatever batch it is computed in.
fn k_chunk(w: &QMatrix, act: ActType) -> usize {
    let block = w.ty.block_size().max(act.block_size());
    let per_block = act.row_bytes(block);
    (ACT_CHUNK_BYTES / per_block).max(1) * block
}

/// The output pointer, shared by tiles that write disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: tiles write disjoint elements (see `Plan::tile`; each job's output is its own
// `&mut`), and the pointers outlive the parallel loop, which joins before
// `matmul_batch_with` returns.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
