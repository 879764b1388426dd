//! `mlaserve logits`: float32 logits [tokens, vocab] of a token sequence as .npy.

use crate::npy;
use anyhow::{Context, Result};
use mlaserve_model::{score::score_on, AttentionPath, Executor};
use std::path::Path;

pub fn parse_tokens(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .with_context(|| format!("bad token id `{t}` in --tokens"))
        })
        .collect()
}

pub fn run(
    exec: &mut dyn Executor,
    tokens: &[u32],
    path: AttentionPath,
    chunk: usize,
    out: &Path,
) -> Result<()> {
    let logits = score_on(exec, tokens, path, chunk)?;
    let vocab = exec.config().vocab_size;
    npy::write_f32(out, &[tokens.len(), vocab], &logits)
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "wrote {} x {} logits to {}",
        tokens.len(),
        vocab,
        out.display()
    );
    Ok(())
}
