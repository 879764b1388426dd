//! `Sequence`: the scheduler's view of one request.
//!
//! Invariants: `token_ids = prompt ++ output`; `num_computed_tokens <= token_ids.len()` and
//! the latent rows of positions `0..num_computed_tokens` are in the cache at the blocks of
//! `block_table`; a waiting sequence holds no blocks and has `num_computed_tokens == 0`
//! (preemption recomputes). The text side of a request (detokenizer, stop strings) lives
//! with the engine's per-request output state, not here, so preemption never touches it.

use crate::block_manager::BlockTable;
use crate::request::{FinishReason, RequestId};
use crate::rng::Rng;
use crate::sampler::{self, Sampled, SamplerError};
use crate::sampling_params::SamplingParams;

/// Where a live sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    /// Queued (new, or preempted and waiting to recompute).
    Waiting,
    /// Admitted: holds blocks, is prefilling (possibly in chunks) or decoding.
    Running,
}

/// One request's tokens, progress, blocks and sampling state.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: RequestId,
    /// Arrival order; the newest running sequence (largest) is preempted first.
    pub arrival: u64,
    token_ids: Vec<u32>,
    prompt_len: usize,
    /// Positions whose latent rows are in the cache.
    pub num_computed_tokens: usize,
    /// Prompt tokens served by the prefix cache at first admission (`None` before it).
    pub num_cached_prompt_tokens: Option<usize>,
    pub block_table: BlockTable,
    pub status: SequenceStatus,
    pub params: SamplingParams,
    /// This request's own random stream (seeded from `params.seed` or by the engine).
    pub rng: Rng,
    /// Times this sequence was preempted.
    pub num_preemptions: u32,
}

impl Sequence {
    /// A waiting sequence. `prompt` must be non-empty (the engine validates requests).
    pub fn new(
        id: RequestId,
        arrival: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
        rng_seed: u64,
    ) -> Self {
        assert!(
            !prompt.is_empty(),
            "a sequence needs at least one prompt token"
        );
        let rng = Rng::seed_from_u64(params.seed.unwrap_or(rng_seed));
        Self {
            id,
            arrival,
            prompt_len: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            num_cached_prompt_tokens: None,
            block_table: BlockTable::default(),
            status: SequenceStatus::Waiting,
            params,
            rng,
            num_preemptions: 0,
        }
    }

    /// Prompt followed by the generated tokens.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn prompt_tokens(&self) -> &[u32] {
        &self.token_ids[..self.prompt_len]
    }

    pub fn output_tokens(&self) -> &[u32] {
        &self.token_ids[self.prompt_len..]
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }

    /// Known tokens whose rows are not in the cache yet.
    pub fn num_uncomputed_tokens(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// The block table (mutable) next to the tokens, for registering computed blocks.
    pub fn block_table_and_tokens(&mut self) -> (&mut BlockTable, &[u32]) {
        (&mut self.block_table, &self.token_ids)
    }

    /// Samples the next token from `logits` (`[vocab_size]`) with this sequence's params,
    /// history and RNG. Does not append it.
    pub fn sample_next(
        &mut self,
        logits: &[f32],
        vocab_size: usize,
    ) -> Result<Sampled, SamplerError> {
        let mut rng = self.rng.clone();
        let r = self.sample_with(logits, vocab_size, &mut rng);
        self.rng = rng;
        r
    }

    /// [`Sequence::sample_next`] drawing from `rng` (a copy of this sequence's stream, to be
    /// stored back), so that a step's rows can be sampled in parallel from shared references.
    pub fn sample_with(
        &self,
        logits: &[f32],
        vocab_size: usize,
        rng: &mut Rng,
    ) -> Result<Sampled, SamplerError> {
        let (prompt, output) = self.token_ids.split_at(self.prompt_len);
        sampler::sample(logits, vocab_size, &self.params, prompt, output, rng)
    }

    /// Appends a sampled token.
    pub fn append_token(&mut self, token_id: u32) {
        self.token_ids.push(token_id);
    }

    /// Token-level stop check after a token was appended: a stop token id, EOS (unless
    /// `ignore_eos`), then `max_tokens` or a full context. Stop strings are the engine's job
    /// (they need text).
    pub fn check_token_stop(&self, eos_ids: &[u32], max_model_len: usize) -> Option<FinishReason> {
        let last = *self.output_tokens().last()?;
        if self.params.stop_token_ids.contains(&last)
            || (!self.params.ignore_eos && eos_ids.contains(&last))
        {
            return Some(FinishReason::Stop);
        }
        if self.num_output_tokens() >= self.params.max_tokens || self.num_tokens() >= max_model_len
        {
            return Some(FinishReason::Length);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_stop_order_stop_before_length() {
        let params = SamplingParams {
            max_tokens: 2,
            stop_token_ids: vec![9],
            ..SamplingParams::greedy(2)
        };
        let mut s = Sequence::new(1, 0, vec![1, 2, 3], params, 0);
        assert_eq!(s.check_token_stop(&[0], 100), None);
        s.append_token(5);
        assert_eq!(s.check_token_stop(&[0], 100), None);
        assert_eq!(
            s.check_token_stop(&[0], 4),
            Some(FinishReason::Length),
            "context full"
        );
        s.append_token(9);
        assert_eq!(
            s.check_token_stop(&[0], 100),
            Some(FinishReason::Stop),
            "stop id wins over max_tokens"
        );
        assert_eq!(s.output_tokens(), &[5, 9]);
        assert_eq!(s.prompt_tokens(), &[1, 2, 3]);
    }

    #[test]
    fn eos_respects_ignore_eos() {
        let mut s = Sequence::new(1, 0, vec![1], SamplingParams::greedy(10), 0);
        s.append_token(0);
        assert_eq!(s.check_token_stop(&[0], 100), Some(FinishReason::Stop));
        let mut s = Sequence::new(
            1,
            0,
            vec![1],
            SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(10)
            },
            0,
        );
        s.append_token(0);
        assert_eq!(s.check_token_stop(&[0], 100), None);
    }
}
