//! Errors of the tokenizer crate. Every variant names what was wrong and where (a GGUF key, a
//! file path, a token id) so a bad model file can be fixed without a debugger.

use std::path::PathBuf;

/// Everything that can go wrong while building or using a [`crate::Tokenizer`] or a
/// [`crate::ChatTemplate`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A GGUF metadata key that the tokenizer needs is absent.
    #[error("{file}: GGUF metadata key `{key}` is missing")]
    MissingKey { file: String, key: String },

    /// A GGUF metadata value is present but malformed (wrong type, bad entry, out of range).
    #[error("{file}: GGUF metadata key `{key}`: {reason}")]
    BadMetadata {
        file: String,
        key: String,
        reason: String,
    },

    /// `tokenizer.ggml.model` names a tokenizer family we do not implement.
    #[error("unsupported tokenizer model `{model}` in tokenizer.ggml.model (supported: gpt2 = byte-level BPE)")]
    UnsupportedModel { model: String },

    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not know.
    #[error("unknown pre-tokenizer `{pre}` in tokenizer.ggml.pre (known: {known})")]
    UnknownPreTokenizer { pre: String, known: String },

    /// Reading a file of an HF model directory failed.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file of an HF model directory (tokenizer.json, tokenizer_config.json, ...) is malformed.
    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },

    /// A token id passed to decode is not in the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },

    /// The `tokenizers` library failed (encode/decode/build).
    #[error("tokenizer: {0}")]
    Backend(String),

    /// A chat template failed to parse or render; the message carries minijinja's location info.
    #[error("chat template: {0}")]
    Template(String),
}

impl TokenizerError {
    pub(crate) fn bad(key: &str, reason: impl Into<String>) -> Self {
        TokenizerError::BadMetadata {
            file: String::new(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn missing(key: &str) -> Self {
        TokenizerError::MissingKey {
            file: String::new(),
            key: key.to_string(),
        }
    }

    /// Fills in the GGUF file name of metadata errors.
    pub(crate) fn in_file(mut self, name: &str) -> Self {
        if let TokenizerError::MissingKey { file, .. } | TokenizerError::BadMetadata { file, .. } =
            &mut self
        {
            *file = name.to_string();
        }
        self
    }

    pub(crate) fn backend(e: impl std::fmt::Display) -> Self {
        TokenizerError::Backend(e.to_string())
    }
}
