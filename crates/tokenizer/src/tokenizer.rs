//! [`Tokenizer`]: text ⇄ token ids for one model, plus the ids and template the engine needs.
//!
//! Invariants:
//! - every id in `0..vocab_size()` decodes; `decode` rejects ids outside it (an error, never a
//!   silently dropped token);
//! - `encode(text, false)` never adds tokens that are not in the text; `encode(text, true)` adds
//!   the BOS (and EOS) exactly as the model's tokenizer metadata asks;
//! - special tokens written literally in the text (e.g. `<|user|>`) are matched as single tokens
//!   whatever `add_special_tokens` says — as HF `tokenizers` does and chat templates rely on;
//! - no "clean up tokenization spaces" pass: decode returns exactly the bytes of the tokens, so
//!   streaming and full decodes agree.

use std::collections::HashSet;

use crate::{ChatTemplate, TokenizerError};

/// Extra tokens to place around the encoding when `add_special_tokens` is true. Used where the
/// wrapped `tokenizers` object has no post-processor doing it (GGUF vocabularies, and HF
/// directories whose tokenizer.json lacks the BOS that tokenizer_config.json asks for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SpecialWrap {
    pub prepend: Option<u32>,
    pub append: Option<u32>,
}

/// A model's tokenizer. `Send + Sync`; share it in an `Arc`.
pub struct Tokenizer {
    pub(crate) inner: tokenizers::Tokenizer,
    pub(crate) vocab_size: usize,
    pub(crate) bos_id: Option<u32>,
    pub(crate) eos_ids: Vec<u32>,
    pub(crate) wrap: SpecialWrap,
    pub(crate) special_ids: HashSet<u32>,
    pub(crate) chat_template: Option<ChatTemplate>,
    /// Why the model's template is unusable, when it has one that failed to parse.
    pub(crate) chat_template_error: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("special_tokens", &self.special_ids.len())
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// Builds a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file (byte-level BPE only).
    pub fn from_gguf(file: &mlaserve_gguf::GgufFile) -> Result<Self, TokenizerError> {
        crate::gguf_vocab::GgufVocab::read(file)?.build()
    }

    /// Builds a tokenizer from an HF model directory: `tokenizer.json` (required), plus
    /// `tokenizer_config.json` (chat template, BOS/EOS, `add_bos_token`) and
    /// `generation_config.json` (every EOS id) when present.
    pub fn from_hf_dir(dir: &std::path::Path) -> Result<Self, TokenizerError> {
        crate::hf::load(dir)
    }

    /// Token ids of `text`. With `add_special_tokens`, the model's BOS/EOS are added as its
    /// metadata says. For chat-template output pass `false`: templates write BOS themselves.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| {
                TokenizerError::Backend(format!("encoding {} bytes of text: {e}", text.len()))
            })?;
        let ids = enc.get_ids();
        if !add_special_tokens || self.wrap == SpecialWrap::default() {
            return Ok(ids.to_vec());
        }
        // Unconditional, like HF's post-processors: a literal BOS in the text gives two BOS.
        let mut out = Vec::with_capacity(ids.len() + 2);
        out.extend(self.wrap.prepend);
        out.extend_from_slice(ids);
        out.extend(self.wrap.append);
        Ok(out)
    }

    /// Text of `ids`. With `skip_special_tokens`, special (control) tokens are left out.
    /// Invalid UTF-8 (a character cut by the end of `ids`) comes out as U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::TokenOutOfRange {
                id,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Backend(format!("decoding {} ids: {e}", ids.len())))
    }

    /// Number of token ids (`0..vocab_size()` are all valid). May be smaller than the model's
    /// embedding rows (`ModelConfig::vocab_size`), which are often padded.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Id of a vocabulary entry, written as stored (byte-level form: `"Ġhello"` for `" hello"`;
    /// special tokens as themselves).
    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    /// Vocabulary entry of an id, as stored (see [`Tokenizer::token_to_id`]).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Every id that ends generation (EOS, end-of-turn, end-of-message, ...), sorted, no duplicates.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Whether `id` is a special (control) token — the ones `skip_special_tokens` removes.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// The model's chat template; `None` means the model has none (callers should then say
    /// "model has no chat template" rather than guess a format).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// When the model ships a chat template that failed to parse, the parse error (then
    /// [`Tokenizer::chat_template`] is `None`). Lets callers say why chat is unavailable.
    pub fn chat_template_error(&self) -> Option<&str> {
        self.chat_template_error.as_deref()
    }

    /// The wrapped HF `tokenizers` object (for features this API does not cover).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Finishes construction: records special ids and normalizes the EOS list.
    pub(crate) fn assemble(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        mut eos_ids: Vec<u32>,
        wrap: SpecialWrap,
        chat_template: Option<ChatTemplate>,
    ) -> Result<Self, TokenizerError> {
        // One past the largest id (model vocabulary or added token): ids may have holes.
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&max| max as usize + 1);
        let check = |what: &str, id: u32| {
            if (id as usize) < vocab_size {
                Ok(())
            } else {
                Err(TokenizerError::Backend(format!(
                    "{what} id {id} is out of range for a vocabulary of {vocab_size} tokens"
                )))
            }
        };
        if let Some(id) = bos_id {
            check("BOS", id)?;
        }
        for &id in &eos_ids {
            check("EOS", id)?;
        }
        for id in [wrap.prepend, wrap.append].into_iter().flatten() {
            check("added special token", id)?;
        }
        eos_ids.sort_unstable();
        eos_ids.dedup();
        let special_ids = inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, tok)| tok.special)
            .map(|(&id, _)| id)
            .collect();
        Ok(Tokenizer {
            inner,
            vocab_size,
            bos_id,
            eos_ids,
            wrap,
            special_ids,
            chat_template,
            chat_template_error: None,
        })
    }
}
