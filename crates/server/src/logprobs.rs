//! Engine logprobs ([`TokenLogprob`]) → the two OpenAI shapes.
//!
//! Token strings are the token decoded alone (special tokens kept), as vLLM reports them; a
//! token that is part of a multi-byte character decodes to U+FFFD. `-inf` becomes -9999.
//! Completions: `top_logprobs` maps text → logprob for the top N plus the sampled token.
//! Chat: `top_logprobs` lists exactly the top N, each with its UTF-8 `bytes`.

use mlaserve_engine::TokenLogprob;
use mlaserve_tokenizer::Tokenizer;

use crate::protocol::{
    finite_logprob, ChatLogprobToken, ChatTopLogprob, CompletionLogprobs, TokenLogprobMap,
};

/// The text of one token on its own.
pub(crate) fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer
        .decode(&[id], false)
        .ok()
        .or_else(|| tokenizer.id_to_token(id))
        .unwrap_or_default()
}

/// Appends tokens to a completion choice's `logprobs`, tracking character offsets.
#[derive(Debug, Default)]
pub(crate) struct CompletionLogprobsBuilder {
    /// Characters of the choice's text before the next token.
    offset: usize,
    pub logprobs: CompletionLogprobs,
}

impl CompletionLogprobsBuilder {
    /// `offset`: characters before the first generated token (the echoed prompt, if any).
    pub fn new(offset: usize) -> Self {
        Self {
            offset,
            logprobs: CompletionLogprobs::default(),
        }
    }

    pub fn push(&mut self, tokenizer: &Tokenizer, lp: &TokenLogprob) {
        let text = token_text(tokenizer, lp.token_id);
        let mut top: Vec<(String, f32)> = lp
            .top
            .iter()
            .map(|&(id, logprob)| (token_text(tokenizer, id), finite_logprob(logprob)))
            .collect();
        if !lp.top.iter().any(|&(id, _)| id == lp.token_id) {
            top.push((text.clone(), finite_logprob(lp.logprob)));
        }
        let out = &mut self.logprobs;
        out.text_offset.push(self.offset);
        out.token_logprobs.push(Some(finite_logprob(lp.logprob)));
        out.top_logprobs.push(Some(TokenLogprobMap(top)));
        self.offset += text.chars().count();
        out.tokens.push(text);
    }

    /// Take what was pushed so far (streaming sends one token per chunk).
    pub fn take(&mut self) -> CompletionLogprobs {
        std::mem::take(&mut self.logprobs)
    }
}

/// One `logprobs.content[]` entry of a chat choice, with at most `top_n` alternatives.
pub(crate) fn chat_logprob(
    tokenizer: &Tokenizer,
    lp: &TokenLogprob,
    top_n: usize,
) -> ChatLogprobToken {
    let token = token_text(tokenizer, lp.token_id);
    let top_logprobs = lp
        .top
        .iter()
        .take(top_n)
        .map(|&(id, logprob)| {
            let token = token_text(tokenizer, id);
            ChatTopLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: finite_logprob(logprob),
            }
        })
        .collect();
    ChatLogprobToken {
        bytes: token.as_bytes().to_vec(),
        token,
        logprob: finite_logprob(lp.logprob),
        top_logprobs,
    }
}
