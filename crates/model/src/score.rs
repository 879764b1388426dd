//! Scoring one token sequence outside the engine: every position's logits, in chunks.
//!
//! This is the hook behind `mlaserve logits`, the model tests and `doctor`: a fresh cache,
//! the sequence fed `chunk` tokens at a time (each chunk after the first attends to the cached
//! context), logits of every position returned. With `chunk = 1` every token takes the decode
//! path under `AttentionPath::Auto`.

use crate::error::ModelError;
use crate::executor::{CpuExecutor, Executor};
use crate::forward_batch::{AttentionPath, ForwardBatch, LogitsWanted, SeqInput};
use crate::model::Model;

/// Block size used for scoring caches.
pub const SCORE_BLOCK_SIZE: usize = 16;

/// Logits [tokens.len(), vocab] of `tokens` fed in chunks of `chunk` (0 = all at once).
pub fn score(
    model: &Model,
    tokens: &[u32],
    path: AttentionPath,
    chunk: usize,
) -> Result<Vec<f32>, ModelError> {
    score_on(&mut CpuExecutor::new(model), tokens, path, chunk)
}

/// [`score`] on any executor; (re)initializes its cache to fit `tokens`.
pub fn score_on(
    exec: &mut dyn Executor,
    tokens: &[u32],
    path: AttentionPath,
    chunk: usize,
) -> Result<Vec<f32>, ModelError> {
    if tokens.is_empty() {
        return Err(ModelError::Batch("no tokens to score".into()));
    }
    let chunk = if chunk == 0 { tokens.len() } else { chunk };
    let num_blocks = tokens.len().div_ceil(SCORE_BLOCK_SIZE);
    exec.init_cache(num_blocks, SCORE_BLOCK_SIZE)?;
    let block_table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut out = Vec::with_capacity(tokens.len() * exec.config().vocab_size);
    let mut done = 0;
    while done < tokens.len() {
        let end = (done + chunk).min(tokens.len());
        let seq = SeqInput {
            tokens: tokens[done..end].to_vec(),
            context_len: done,
            block_table: block_table.clone(),
            logits: LogitsWanted::All,
        };
        let batch = ForwardBatch::new(vec![seq], SCORE_BLOCK_SIZE, path)?;
        out.extend(exec.forward(&batch)?);
        done = end;
    }
    Ok(out)
}

/// Greedy continuation of `prompt` by `n` tokens (argmax, ties to the lower id), one decode
/// step per token over the latent cache. Returns only the generated ids.
pub fn greedy(
    model: &Model,
    prompt: &[u32],
    n: usize,
    path: AttentionPath,
) -> Result<Vec<u32>, ModelError> {
    greedy_on(&mut CpuExecutor::new(model), prompt, n, path)
}

/// [`greedy`] on any executor; (re)initializes its cache to fit the sequence.
pub fn greedy_on(
    exec: &mut dyn Executor,
    prompt: &[u32],
    n: usize,
    path: AttentionPath,
) -> Result<Vec<u32>, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Batch("empty prompt".into()));
    }
    let total = prompt.len() + n;
    let num_blocks = total.div_ceil(SCORE_BLOCK_SIZE);
    exec.init_cache(num_blocks, SCORE_BLOCK_SIZE)?;
    let block_table: Vec<u32> = (0..num_blocks as u32).collect();
    let vocab = exec.config().vocab_size;
    let mut out = Vec::with_capacity(n);
    let mut next: Vec<u32> = prompt.to_vec();
    let mut ctx = 0;
    for _ in 0..n {
        let seq = SeqInput {
            tokens: next.clone(),
            context_len: ctx,
            block_table: block_table.clone(),
            logits: LogitsWanted::Last,
        };
        let batch = ForwardBatch::new(vec![seq], SCORE_BLOCK_SIZE, path)?;
        let logits = exec.forward(&batch)?;
        ctx += next.len();
        let tok = argmax(&logits[..vocab]);
        out.push(tok);
        next = vec![tok];
    }
    Ok(out)
}

/// Index of the largest value, ties to the lower index.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}
