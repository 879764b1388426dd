//! `ModelRunner`: owns the executor (the model and its latent cache, on whatever device);
//! turns a schedule into one `ForwardBatch`, runs it, and hands back one logits row per
//! sequence that wanted one — or, when any such sequence samples greedily or by a draw
//! (temperature, top-k, top-p, min-p; no penalties or logprobs), each of those rows' token
//! picked on the device ([`Executor::forward_picks`]: 20 bytes a row cross to the host
//! instead of 400 KB at a 102,400-token vocabulary; the token is the one the host sampler
//! would draw, bit for bit) and only the other rows whole. `MLASERVE_DEVICE_SAMPLING=0`
//! turns that off (comparisons).
//!
//! Invariant: the scheduler has already grown every scheduled sequence's block table to
//! hold `context_len + num_new_tokens` positions, so the batch always validates.

use mlaserve_model::{
    AttentionPath, Executor, ForwardBatch, LogitsWanted, ModelConfig, ModelError, RowDraw, RowPick,
    SeqInput,
};

use crate::request::RequestId;
use crate::scheduler::{Scheduler, SchedulerOutput};

/// The executor and the batch layout.
pub struct ModelRunner {
    executor: Box<dyn Executor>,
    block_size: usize,
    path: AttentionPath,
    /// The last step's logits buffer, handed back by [`ModelRunner::recycle`]: the next step
    /// copies its logits into the same memory (26 MB a step at 64 rows of a 102,400-token
    /// vocabulary; a fresh buffer costs its allocation and page faults every step).
    spare: Vec<f32>,
    spare_picks: Vec<RowPick>,
    /// The whole rows of picked steps: a buffer of their own, so `spare` keeps its length
    /// (a shorter one is filled before the next whole copy).
    spare_whole: Vec<f32>,
    draws: Vec<RowDraw>,
    /// Steps with a row that [`SamplingParams::draws_on_device`] take
    /// [`Executor::forward_picks`].
    ///
    /// [`SamplingParams::draws_on_device`]: crate::SamplingParams::draws_on_device
    device_sampling: bool,
}

/// What one step handed back for the sequences that wanted logits.
#[derive(Debug, Clone)]
pub enum StepRows {
    /// `[ids.len(), vocab_size]` row-major.
    Logits(Vec<f32>),
    /// One a row: each row's token picked on the device (its params'
    /// [`row_draw`](crate::SamplingParams::row_draw) from its RNG as it was before the step),
    /// and `whole` `[n, vocab_size]` the rows whose draw was [`RowDraw::Whole`] (the host
    /// samples them): row `i`'s at `whole_at[i]`.
    Picks {
        picks: Vec<RowPick>,
        whole: Vec<f32>,
        whole_at: Vec<Option<u32>>,
    },
}

/// Logits of one step: row `i` belongs to `ids[i]`.
#[derive(Debug, Clone)]
pub struct StepLogits {
    pub ids: Vec<RequestId>,
    pub rows: StepRows,
    pub vocab_size: usize,
}

impl StepLogits {
    /// `[vocab_size]` logits of the i-th sequence that wanted logits (None: the step
    /// handed back its pick only).
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        let v = self.vocab_size;
        match &self.rows {
            StepRows::Logits(l) => Some(&l[i * v..(i + 1) * v]),
            StepRows::Picks {
                whole, whole_at, ..
            } => whole_at[i].map(|k| &whole[k as usize * v..(k as usize + 1) * v]),
        }
    }

    fn len(&self) -> usize {
        match &self.rows {
            StepRows::Logits(l) => l.len() / self.vocab_size.max(1),
            StepRows::Picks { picks, .. } => picks.len(),
        }
    }
}

impl ModelRunner {
    /// Has `executor` allocate a zeroed cache of `num_blocks` blocks.
    pub fn new(
        mut executor: Box<dyn Executor>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, ModelError> {
        executor.init_cache(num_blocks, block_size)?;
        let path = executor.attention_path();
        Ok(Self {
            executor,
            block_size,
            path,
            spare: Vec::new(),
            spare_whole: Vec::new(),
            spare_picks: Vec::new(),
            draws: Vec::new(),
            device_sampling: std::env::var("MLASERVE_DEVICE_SAMPLING").map_or(true, |v| v != "0"),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.executor.config()
    }

    pub fn device(&self) -> String {
        self.executor.device()
    }

    /// Builds the step's `ForwardBatch` from the scheduled sequences, in schedule order.
    pub fn build_batch(
        &self,
        out: &SchedulerOutput,
        scheduler: &Scheduler,
    ) -> Result<(ForwardBatch, Vec<RequestId>), ModelError> {
        let mut seqs = Vec::with_capacity(out.seqs.len());
        let mut wanted = Vec::new();
        for s in &out.seqs {
            let seq = scheduler.seq(s.id).ok_or_else(|| {
                ModelError::Batch(format!("scheduled request {} is not live", s.id))
            })?;
            let end = s.context_len + s.num_new_tokens;
            let tokens = seq.token_ids().get(s.context_len..end).ok_or_else(|| {
                ModelError::Batch(format!(
                    "request {}: tokens {}..{end} past its {}",
                    s.id,
                    s.context_len,
                    seq.num_tokens()
                ))
            })?;
            let logits = if s.wants_logits {
                wanted.push(s.id);
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            seqs.push(SeqInput {
                tokens: tokens.to_vec(),
                context_len: s.context_len,
                block_table: seq.block_table.blocks().to_vec(),
                logits,
            });
        }
        Ok((ForwardBatch::new(seqs, self.block_size, self.path)?, wanted))
    }

    /// Runs one step. A panic inside the model is caught and reported as an error, so the
    /// engine can fail the step's requests and keep serving.
    pub fn run(
        &mut self,
        out: &SchedulerOutput,
        scheduler: &Scheduler,
    ) -> Result<StepLogits, ModelError> {
        let (batch, ids) = self.build_batch(out, scheduler)?;
        let vocab_size = self.executor.config().vocab_size;
        // Each row's draw from a copy of its RNG: sampling takes the same bits from the
        // sequence's own stream afterwards (engine::sample_rows); rows the device cannot draw
        // come back whole.
        self.draws.clear();
        let mut whole_at = Vec::new();
        if self.device_sampling {
            let mut n_whole = 0;
            for &id in &ids {
                let seq = scheduler.seq(id);
                let d = match seq.filter(|s| s.params.draws_on_device()) {
                    Some(s) => s.params.row_draw(&mut s.rng.clone()),
                    None => RowDraw::Whole,
                };
                whole_at.push((d == RowDraw::Whole).then(|| {
                    n_whole += 1;
                    n_whole - 1
                }));
                self.draws.push(d);
            }
        }
        // An executor that would copy every row anyway for a whole one: the plain step.
        let picks = self.draws.iter().any(|&d| d != RowDraw::Whole)
            && (self.executor.picks_whole_rows() || !self.draws.contains(&RowDraw::Whole));
        let executor = &mut self.executor;
        let mut rows = if picks {
            StepRows::Picks {
                picks: std::mem::take(&mut self.spare_picks),
                whole: std::mem::take(&mut self.spare_whole),
                whole_at,
            }
        } else {
            StepRows::Logits(std::mem::take(&mut self.spare))
        };
        let draws = &self.draws;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &mut rows {
            StepRows::Logits(l) => executor.forward_into(&batch, l),
            StepRows::Picks { picks, whole, .. } => {
                executor.forward_picks(&batch, draws, picks, whole)
            }
        }));
        let step = StepLogits {
            ids,
            rows,
            vocab_size,
        };
        let checked = match result {
            Ok(Ok(()))
                if step.len() != step.ids.len()
                    || matches!(&step.rows, StepRows::Logits(l) if l.len() % vocab_size.max(1) != 0)
                    || matches!(&step.rows, StepRows::Picks { whole, whole_at, .. }
                        if whole.len() != whole_at.iter().flatten().count() * vocab_size) =>
            {
                let whole = match &step.rows {
                    StepRows::Picks {
                        whole, whole_at, ..
                    } => format!(
                        " and {} values of whole rows for {} such rows",
                        whole.len(),
                        whole_at.iter().flatten().count()
                    ),
                    StepRows::Logits(_) => String::new(),
                };
                Err(ModelError::Batch(format!(
                    "forward returned {} rows{whole}, expected {} of {vocab_size}",
                    step.len(),
                    step.ids.len()
                )))
            }
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(ModelError::Batch(format!("forward pass panicked: {msg}")))
            }
        };
        if let Err(e) = checked {
            self.recycle(step); // its memory serves the next step all the same
            return Err(e);
        }
        Ok(step)
    }

    /// Takes a step's logits back once sampled, for the next step to reuse their memory.
    pub fn recycle(&mut self, step: StepLogits) {
        match step.rows {
            StepRows::Logits(l) => self.spare = l,
            StepRows::Picks { picks, whole, .. } => {
                self.spare_picks = picks;
                self.spare_whole = whole;
            }
        }
    }
}
