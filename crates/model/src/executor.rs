//! `Executor`: where a model's forward steps run — the CPU, a GPU, or several ranks.
//!
//! The engine owns one `Box<dyn Executor>` and never sees weights or caches: it sizes the
//! latent cache once with [`Executor::init_cache`], then calls [`Executor::forward`] per step.
//! Every implementation returns logits with the CPU reference's layout, `[rows, vocab]`
//! row-major for `batch.logits_indices()`, so any executor can be checked against
//! [`CpuExecutor`] row by row.
//!
//! [`Executor::forward_picks`] is the same step reduced on the device to each row's
//! [`RowPick`] (its [`RowArgmax`] and its token, greedy or drawn at a temperature:
//! [`crate::draw`]): for steps whose every row samples without penalties, logprobs or
//! top-k/top-p/min-p, so that a GPU ships a few bytes a row to the host instead of the row
//! (400 KB at a 102,400-token vocabulary).
//!
//! Invariant: `forward` before `init_cache` is an error, never a panic.

use crate::config::ModelConfig;
use crate::draw::{RowDraw, RowPick};
use crate::error::ModelError;
use crate::forward_batch::{AttentionPath, ForwardBatch};
use crate::kv_cache::LatentCache;
use crate::model::Model;
use std::ops::Deref;
use std::sync::Arc;

/// Runs forward steps against a latent cache it owns.
pub trait Executor: Send {
    /// The model's validated configuration.
    fn config(&self) -> &ModelConfig;
    /// Default attention path for batches the engine builds.
    fn attention_path(&self) -> AttentionPath;
    /// Allocates (or replaces) the latent cache: `num_blocks` blocks of `block_size` slots.
    fn init_cache(&mut self, num_blocks: usize, block_size: usize) -> Result<(), ModelError>;
    /// Runs one step and returns logits `[batch.logits_indices().len(), vocab_size]`.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, ModelError>;
    /// [`Executor::forward`] into `out` (replaced; its memory reused where the executor
    /// copies the logits from a device: at 64 rows of a 102,400-token vocabulary that is 26 MB
    /// a step, whose fresh allocation and page faults a kept buffer avoids). The engine and
    /// `mlaserve bench` call this with one buffer for all steps.
    fn forward_into(&mut self, batch: &ForwardBatch, out: &mut Vec<f32>) -> Result<(), ModelError> {
        *out = self.forward(batch)?;
        Ok(())
    }
    /// Runs one step like [`Executor::forward`] and hands back, for each logits row, its
    /// [`RowPick`] under `draws[row]` (`out` replaced, one a row): the row's argmax and the
    /// token its draw chose, instead of the row — and in `whole` (replaced) the rows whose
    /// draw is [`RowDraw::Whole`], in order, `[n_whole, vocab]`. By default the logits are
    /// computed and reduced on the host, rows in parallel ([`crate::draw::picks_of`]); a GPU
    /// executor reduces them on the device and copies only the whole rows.
    fn forward_picks(
        &mut self,
        batch: &ForwardBatch,
        draws: &[RowDraw],
        out: &mut Vec<RowPick>,
        whole: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let vocab = self.config().vocab_size;
        let logits = self.forward(batch)?;
        crate::draw::picks_of(&logits, vocab, draws, out, whole)
    }
    /// Whether [`Executor::forward_picks`] hands back [`RowDraw::Whole`] rows for less than
    /// a whole step's rows cost (the engine otherwise takes such a step's logits whole):
    /// true where the picks are made on the host anyway.
    fn picks_whole_rows(&self) -> bool {
        true
    }
    /// Where it runs, for logs and `/v1/models`: "cpu", "cuda:0", "cpu tp=2".
    fn device(&self) -> String;
    /// Seconds spent in collectives (all-reduce) since the last call; None where not measured.
    fn take_comm_seconds(&mut self) -> Option<f64> {
        None
    }
}

/// One logits row reduced to what greedy sampling reads of it: the first index of its
/// largest value, and the first value no sampler can use (NaN or +inf), if any. The
/// definition every executor's reduction must match bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowArgmax {
    /// The lowest index holding `max` (0 where every value is -inf or unusable).
    pub token_id: u32,
    /// The largest value that is neither NaN nor +inf (-inf where none is larger).
    pub max: f32,
    /// The lowest index holding NaN or +inf, and that value.
    pub first_bad: Option<(u32, f32)>,
}

impl RowArgmax {
    /// The reference reduction of one row: one pass in 16 independent lanes (vectorized) for
    /// the largest value and whether any is unusable, then the first index of the max; a row
    /// with an unusable value (an error for every sampler, so rare) takes a second, plain pass.
    pub fn of(row: &[f32]) -> Self {
        const L: usize = 16;
        let usable = |v: f32| !(v.is_nan() | (v == f32::INFINITY));
        let mut m = [f32::NEG_INFINITY; L];
        let mut bad = [false; L];
        let chunks = row.chunks_exact(L);
        let tail = chunks.remainder();
        let mut step = |i: usize, v: f32| {
            m[i] = if v > m[i] { v } else { m[i] }; // NaN never wins; +inf does, then `bad`
            bad[i] |= !usable(v);
        };
        for c in chunks {
            for (i, &v) in c.iter().enumerate() {
                step(i, v);
            }
        }
        for (i, &v) in tail.iter().enumerate() {
            step(i, v);
        }
        if bad.iter().any(|&b| b) {
            return Self::of_unusable(row);
        }
        let max = m
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        if max == f32::NEG_INFINITY {
            return Self {
                token_id: 0,
                max,
                first_bad: None,
            };
        }
        // -0.0 == 0.0: the first index holding either, and that value's own bits
        let token_id = first_index(row, |v| v == max).unwrap_or(0);
        Self {
            token_id: token_id as u32,
            max: row[token_id],
            first_bad: None,
        }
    }

    /// [`RowArgmax::of`] value by value — its definition: the first index where a usable value
    /// beats every earlier one (strictly), the first unusable value. For rows holding NaN or
    /// +inf, and the unit test's reference for every row.
    fn of_unusable(row: &[f32]) -> Self {
        let mut best = (f32::NEG_INFINITY, 0u32);
        let mut first_bad = None;
        for (i, &v) in row.iter().enumerate() {
            if v.is_nan() || v == f32::INFINITY {
                first_bad = first_bad.or(Some((i as u32, v)));
            } else if v > best.0 {
                best = (v, i as u32);
            }
        }
        Self {
            token_id: best.1,
            max: best.0,
            first_bad,
        }
    }
}

/// The first index of `row` where `hit` holds: 64-value chunks tested whole (vectorized, no
/// early exit inside a chunk), then the chunk that has it value by value.
fn first_index(row: &[f32], hit: impl Fn(f32) -> bool) -> Option<usize> {
    const C: usize = 64;
    let j = row
        .chunks(C)
        .position(|c| c.iter().fold(false, |a, &v| a | hit(v)))?;
    row[j * C..].iter().position(|&v| hit(v)).map(|i| j * C + i)
}

/// The reference executor: [`Model::forward`] on this thread (its kernels use rayon). Holds the
/// model by `Arc` (the engine) or by reference (`score`, `doctor`: `CpuExecutor<&Model>`).
pub struct CpuExecutor<M = Arc<Model>> {
    model: M,
    cache: Option<LatentCache>,
}

impl<M: Deref<Target = Model>> CpuExecutor<M> {
    pub fn new(model: M) -> Self {
        Self { model, cache: None }
    }

    pub fn model(&self) -> &M {
        &self.model
    }
}

impl<M: Deref<Target = Model> + Send> Executor for CpuExecutor<M> {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn attention_path(&self) -> AttentionPath {
        self.model.options().attention_path
    }

    fn init_cache(&mut self, num_blocks: usize, block_size: usize) -> Result<(), ModelError> {
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::Batch(format!(
                "cache of {num_blocks} blocks of {block_size} slots"
            )));
        }
        self.cache = Some(LatentCache::new(
            self.model.config(),
            num_blocks,
            block_size,
        ));
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, ModelError> {
        let cache = self.cache.as_mut().ok_or_else(|| {
            ModelError::Batch("forward before init_cache: no latent cache".into())
        })?;
        self.model.forward(batch, cache)
    }

    fn device(&self) -> String {
        "cpu".into()
    }
}

#[cfg(test)]
mod tests {
    use super::RowArgmax;

    #[test]
    fn the_lane_reduction_is_the_definition() {
        let (nan, inf, ninf) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY);
        let mut rows: Vec<Vec<f32>> = vec![
            vec![],
            vec![ninf; 40],
            vec![nan, ninf, ninf],
            vec![inf, ninf],
            vec![-0.0, 0.0, -0.0],
            vec![0.0, -0.0],
            vec![nan; 33],
            vec![1.0, nan, 2.0, inf, 2.0],
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in [1, 15, 16, 17, 100, 1000] {
            for special in [nan, inf, ninf, -0.0, 3.5] {
                let mut row = Vec::with_capacity(len);
                for _ in 0..len {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // many ties, and zeros of both signs
                    let v = ((x % 8) as f32) - 4.0;
                    row.push(if v == 0.0 && x.is_multiple_of(3) {
                        -0.0
                    } else {
                        v
                    });
                }
                let at = (x as usize) % len;
                row[at] = special;
                rows.push(row);
            }
        }
        for row in &rows {
            let (got, want) = (RowArgmax::of(row), RowArgmax::of_unusable(row));
            let bits = |r: &RowArgmax| {
                (
                    r.token_id,
                    r.max.to_bits(),
                    r.first_bad.map(|(i, v)| (i, v.to_bits())),
                )
            };
            assert_eq!(bits(&got), bits(&want), "{row:?}");
        }
    }
}
