//! Tokenizer, streaming detokenizer and chat templates for mlaserve.
//!
//! - [`Tokenizer`]: byte-level BPE built from GGUF `tokenizer.ggml.*` metadata
//!   ([`Tokenizer::from_gguf`], llama.cpp semantics) or from an HF directory's `tokenizer.json`
//!   ([`Tokenizer::from_hf_dir`]); both produce HF-identical ids for the same vocabulary.
//! - [`DecodeStream`]: incremental detokenization that never emits half a UTF-8 character and
//!   whose pieces concatenate to the full decode.
//! - [`ChatTemplate`]: the model's Jinja chat template rendered like transformers'
//!   `apply_chat_template`.
//!
//! Everything here is `Send + Sync`; share a `Tokenizer` in an `Arc`. Bad input (malformed
//! metadata, unknown ids, template errors) is a [`TokenizerError`], never a panic.

mod chat_template;
mod decode_stream;
mod error;
mod gguf_vocab;
mod hf;
pub mod pretokenizer;
mod pyjson;
mod strftime;
mod tokenizer;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use decode_stream::DecodeStream;
pub use error::TokenizerError;
pub use tokenizer::Tokenizer;

#[cfg(test)]
mod tests;
