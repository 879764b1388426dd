//! The matmul driver: activation conversion, tiling and threads.
//!
//! `out[t, r] = Σ_c x[t, c] · W[r, c]`. The activation rows are converted once to the weight
//! type's vec_dot type; then the `[n_tokens, rows]` output is cut into tiles of `ROW_TILE`
//! rows × `TOKEN_BLOCK` tokens, which run in parallel on rayon's pool and write disjoint
//! output elements. Inside a tile the columns are walked in chunks (`k_chunk`); for each
//! chunk and each group of 4 tokens (their activation chunks stay in L1) every weight row of
//! the tile meets the group through one row-kernel call, which unpacks each weight block once
//! for the 4 tokens. Partial sums of the chunks are added in column order.
//!
//! Invariant: a token's outputs do not depend on which other tokens share the call — the
//! chunking depends on the weight only and every kernel keeps one accumulator per token — so
//! batched and one-at-a-time results are bit-identical.

use crate::act::{quantize_act_row, ActType};
use crate::isa::Isa;
use crate::kernels::row_kernel;
use crate::qmatrix::QMatrix;
use rayon::prelude::*;
use std::borrow::Cow;
use std::cell::Cell;

/// Rows per tile.
const ROW_TILE: usize = 16;
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
    w.assert_consistent();
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul: x has {} values, expected [{n_tokens} x {}]",
        x.len(),
        w.cols
    );
    assert_eq!(
        out.len(),
        n_tokens * w.rows,
        "matmul: out has {} values, expected [{n_tokens} x {}]",
        out.len(),
        w.rows
    );
    let isa = if isa.is_available() { isa } else { Isa::Scalar };
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    let (Some(act), Some(kernel)) = (ActType::for_weight(w.ty), row_kernel(w.ty, isa)) else {
        unreachable!("QMatrix invariant: {} is supported", w.ty);
    };
    let a_stride = act.row_bytes(w.cols);
    let work = w.rows * w.row_bytes() * n_tokens;
    let parallel = work >= PARALLEL_MIN_WORK && rayon::current_num_threads() > 1;

    let mut scratch = ACT_SCRATCH.with(|c| c.take());
    let acts: Cow<[u8]> = if act == ActType::F32 {
        Cow::Borrowed(bytemuck::cast_slice(x))
    } else {
        scratch.clear();
        scratch.resize(n_tokens * a_stride, 0);
        let rows = scratch
            .chunks_exact_mut(a_stride.max(1))
            .zip(x.chunks_exact(w.cols.max(1)));
        if parallel && n_tokens >= 8 {
            rows.par_bridge()
                .for_each(|(o, xr)| quantize_act_row(act, xr, o));
        } else {
            rows.for_each(|(o, xr)| quantize_act_row(act, xr, o));
        }
        Cow::Owned(std::mem::take(&mut scratch))
    };

    let token_block = if n_tokens <= 4 { n_tokens } else { TOKEN_BLOCK };
    let n_row_tiles = w.rows.div_ceil(ROW_TILE);
    let n_tok_blocks = n_tokens.div_ceil(token_block);
    let k_chunk = k_chunk(w, act);
    let (w_bs, w_ts, a_bs, a_bb) = (
        w.ty.block_size(),
        w.ty.type_size(),
        act.block_size(),
        act.block_bytes(),
    );
    let out_ptr = SendPtr(out.as_mut_ptr());
    let rows = w.rows;
    let run_tile = |i: usize| {
        let (tb, rt) = (i / n_row_tiles, i % n_row_tiles);
        let (t0, t1) = (tb * token_block, ((tb + 1) * token_block).min(n_tokens));
        let (r0, r1) = (rt * ROW_TILE, ((rt + 1) * ROW_TILE).min(rows));
        // acc[(r - r0) * TOKEN_BLOCK + (t - t0)]
        let mut acc = [0f32; ROW_TILE * TOKEN_BLOCK];
        let mut part = [0f32; GROUP];
        let mut k0 = 0;
        while k0 < w.cols {
            let k1 = (k0 + k_chunk).min(w.cols);
            let (wb0, ab0) = (k0 / w_bs * w_ts, k0 / a_bs * a_bb);
            for g0 in (t0..t1).step_by(GROUP) {
                let ng = GROUP.min(t1 - g0);
                let a = &acts[g0 * a_stride + ab0..];
                for r in r0..r1 {
                    kernel(k1 - k0, &w.row(r)[wb0..], a, a_stride, &mut part[..ng]);
                    let dst = &mut acc[(r - r0) * TOKEN_BLOCK + (g0 - t0)..][..ng];
                    for (d, p) in dst.iter_mut().zip(&part[..ng]) {
                        *d += *p;
                    }
                }
            }
            k0 = k1;
        }
        for r in r0..r1 {
            for t in t0..t1 {
                // SAFETY: (t, r) lies inside [n_tokens, rows] and belongs to this tile only;
                // tiles partition the output, so no two writers share an element.
                unsafe {
                    out_ptr
                        .get()
                        .add(t * rows + r)
                        .write(acc[(r - r0) * TOKEN_BLOCK + (t - t0)])
                };
            }
        }
    };
    let n_tiles = n_row_tiles * n_tok_blocks;
    if parallel {
        (0..n_tiles).into_par_iter().for_each(run_tile);
    } else {
        (0..n_tiles).for_each(run_tile);
    }

    if let Cow::Owned(mut v) = acts {
        v.clear();
        ACT_SCRATCH.with(|c| c.set(v));
    } else if scratch.capacity() > 0 {
        ACT_SCRATCH.with(|c| c.set(scratch));
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
// SAFETY: tiles write disjoint elements (see `run_tile`), and the pointer outlives the
// parallel loop, which joins before `matmul_with` returns.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
