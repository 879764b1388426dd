//! Incremental detokenization for streaming responses.
//!
//! Invariants (for any id sequence, fed one id at a time):
//! - the concatenation of every `step` output followed by `finish()` equals
//!   `tokenizer.decode(all_ids, skip_special_tokens)`;
//! - no output ever ends inside a UTF-8 character: bytes of a character split across tokens
//!   (emoji, CJK in byte-level BPE) are held back until the character is complete. (An
//!   incomplete character shows up as U+FFFD in a decode; a real U+FFFD in the text is held
//!   back until the next token, or `finish`.)
//!
//! Method: the prefix-offset / read-offset trick (HF text-generation-inference, vLLM). Text is
//! decoded over a short window `ids[prefix..]` and compared with the decode of
//! `ids[prefix..read]`; the difference is new text. Decoding a window rather than single ids
//! keeps the spaces and byte joins that depend on neighbouring tokens right.

use std::sync::Arc;

use crate::{Tokenizer, TokenizerError};

/// Streaming detokenizer of one sequence. Feed ids with [`DecodeStream::step`].
#[derive(Debug)]
pub struct DecodeStream {
    tok: Arc<Tokenizer>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix_offset: usize,
    /// Ids before this index have been emitted.
    read_offset: usize,
}

impl DecodeStream {
    /// A stream over no tokens yet.
    pub fn new(tok: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        DecodeStream {
            tok,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one id; returns the text it completes, or `None` while a character is incomplete
    /// (or the token decodes to nothing, e.g. a skipped special token).
    pub fn step(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        if id as usize >= self.tok.vocab_size() {
            return Err(TokenizerError::TokenOutOfRange {
                id,
                vocab_size: self.tok.vocab_size(),
            });
        }
        self.ids.push(id);
        let prefix_text = self.tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let new_text = self
            .tok
            .decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if new_text.len() <= prefix_text.len() || new_text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        // The window's earlier text is stable (it did not end in a partial character), so the
        // new decode extends it; fall back to a char-boundary-safe split if a decoder ever
        // rewrites earlier text.
        let delta = match new_text.strip_prefix(prefix_text.as_str()) {
            Some(d) => d.to_string(),
            None => {
                let cut = (0..=prefix_text.len())
                    .rev()
                    .find(|&i| new_text.is_char_boundary(i))
                    .unwrap_or(0);
                new_text[cut..].to_string()
            }
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(Some(delta))
    }

    /// Text still held back (an incomplete character at the end, as U+FFFD like `decode`
    /// prints it). Call once when the sequence ends; the stream is then empty.
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        let prefix_text = self.tok.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let new_text = self
            .tok
            .decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        let rest = new_text
            .strip_prefix(prefix_text.as_str())
            .unwrap_or("")
            .to_string();
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        Ok(rest)
    }

    /// Drops the ids before the window: they are never decoded again, so memory stays bounded
    /// on long generations.
    fn compact(&mut self) {
        self.ids.drain(..self.prefix_offset);
        self.read_offset -= self.prefix_offset;
        self.prefix_offset = 0;
    }
}
