//! Byte-level BPE tokenizer built from GGUF `tokenizer.ggml.*` metadata, as llama.cpp reads it.
//!
//! Reading is split in two: [`GgufVocab::read`] pulls plain values out of the metadata (checking
//! each key's type), and [`GgufVocab::build`] validates them against each other and builds the
//! `tokenizers` pipeline. Tests drive `build` directly with hand-made vocabularies.
//!
//! Invariants of a built tokenizer:
//! - token id `i` is `tokenizer.ggml.tokens[i]` for every `i` (the BPE vocabulary holds all of them,
//!   unused `[PADi]` fillers included, so ids and embedding rows line up);
//! - control (3) and unknown (2) tokens are *special* added tokens: never split, dropped by
//!   `skip_special_tokens`; user-defined (4) tokens are non-special added tokens: never split, always
//!   decoded — the same split HF makes between `special=True/False` added tokens, from which
//!   llama.cpp's converter derived these types;
//! - the pre-tokenizer is chosen by `tokenizer.ggml.pre` (see [`crate::pretokenizer`]); a missing
//!   key means "default" (GPT-2) with a warning, as in llama.cpp; an unknown one is an error;
//! - every malformed value is a [`TokenizerError`] naming the key (and the index inside arrays).

use mlaserve_gguf::{Array, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::AddedToken;

use crate::pretokenizer;
use crate::tokenizer::SpecialWrap;
use crate::{ChatTemplate, Tokenizer, TokenizerError};

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub(crate) const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub(crate) const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub(crate) const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub(crate) const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub(crate) const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub(crate) const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
pub(crate) const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// llama.cpp's `llama_token_type` values stored in `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    fn from_i64(v: i64) -> Option<Self> {
        use TokenType::*;
        Some(match v {
            0 => Undefined,
            1 => Normal,
            2 => Unknown,
            3 => Control,
            4 => UserDefined,
            5 => Unused,
            6 => Byte,
            _ => return None,
        })
    }
}

/// Token texts that end generation in llama.cpp whatever the metadata says (its `special_eog_ids`
/// text list, restricted to the byte-level BPE families we load).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
];

/// The tokenizer part of a GGUF file's metadata, as plain values.
#[derive(Debug, Clone, Default)]
pub(crate) struct GgufVocab {
    pub model: String,
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Option<Vec<i64>>,
    pub merges: Option<Vec<String>>,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    pub eot: Option<u64>,
    pub eom: Option<u64>,
    pub pad: Option<u64>,
    pub unk: Option<u64>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub chat_template: Option<String>,
    /// `{arch}.vocab_size`, when the file has it.
    pub arch_vocab_size: Option<(String, u64)>,
    /// The file's name, for error messages.
    pub source: String,
}

fn type_err(key: &str, expected: &str, v: &Value) -> TokenizerError {
    TokenizerError::bad(key, format!("expected {expected}, found {}", v.type_name()))
}

fn opt_str(file: &mlaserve_gguf::GgufFile, key: &str) -> Result<Option<String>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| type_err(key, "a string", v)),
    }
}

fn opt_bool(file: &mlaserve_gguf::GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| type_err(key, "a bool", v)),
    }
}

/// A token id: any integer type, but not negative.
fn opt_id(file: &mlaserve_gguf::GgufFile, key: &str) -> Result<Option<u64>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => {
            let i = v
                .as_integer()
                .ok_or_else(|| type_err(key, "an integer token id", v))?;
            u64::try_from(i)
                .map(Some)
                .map_err(|_| TokenizerError::bad(key, format!("token id {i} is negative")))
        }
    }
}

fn opt_str_array(
    file: &mlaserve_gguf::GgufFile,
    key: &str,
) -> Result<Option<Vec<String>>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(Value::Array(Array::String(v))) => Ok(Some(v.clone())),
        Some(v) => Err(type_err(key, "an array of strings", v)),
    }
}

/// Token types: llama.cpp requires i32 elements; a narrower or wider declared element type is an
/// error (llama.cpp #26690 read i32s out of a u8 array).
fn opt_token_types(file: &mlaserve_gguf::GgufFile) -> Result<Option<Vec<i64>>, TokenizerError> {
    match file.get(KEY_TOKEN_TYPE) {
        None => Ok(None),
        Some(Value::Array(Array::I32(v))) => Ok(Some(v.iter().map(|&t| i64::from(t)).collect())),
        Some(v) => Err(type_err(KEY_TOKEN_TYPE, "an array of i32", v)),
    }
}

impl GgufVocab {
    /// Pulls the tokenizer keys out of a GGUF file's metadata, checking their types.
    pub fn read(file: &mlaserve_gguf::GgufFile) -> Result<Self, TokenizerError> {
        let source = file.path().display().to_string();
        Self::read_keys(file, source.clone()).map_err(|e| e.in_file(&source))
    }

    fn read_keys(file: &mlaserve_gguf::GgufFile, source: String) -> Result<Self, TokenizerError> {
        let model = opt_str(file, KEY_MODEL)?.ok_or_else(|| TokenizerError::missing(KEY_MODEL))?;
        let tokens =
            opt_str_array(file, KEY_TOKENS)?.ok_or_else(|| TokenizerError::missing(KEY_TOKENS))?;
        let arch_vocab_size = match opt_str(file, "general.architecture")? {
            Some(arch) => {
                let key = format!("{arch}.vocab_size");
                opt_id(file, &key)?.map(|n| (key, n))
            }
            None => None,
        };
        Ok(GgufVocab {
            model,
            pre: opt_str(file, KEY_PRE)?,
            tokens,
            token_types: opt_token_types(file)?,
            merges: opt_str_array(file, KEY_MERGES)?,
            bos: opt_id(file, KEY_BOS)?,
            eos: opt_id(file, KEY_EOS)?,
            eot: opt_id(file, KEY_EOT)?,
            eom: opt_id(file, KEY_EOM)?,
            pad: opt_id(file, KEY_PAD)?,
            unk: opt_id(file, KEY_UNK)?,
            add_bos: opt_bool(file, KEY_ADD_BOS)?,
            add_eos: opt_bool(file, KEY_ADD_EOS)?,
            chat_template: opt_str(file, KEY_CHAT_TEMPLATE)?,
            arch_vocab_size,
            source,
        })
    }

    /// Validates the values against each other and builds the tokenizer.
    pub fn build(self) -> Result<Tokenizer, TokenizerError> {
        let source = self.source.clone();
        self.build_checked().map_err(|e| e.in_file(&source))
    }

    fn build_checked(self) -> Result<Tokenizer, TokenizerError> {
        if self.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel { model: self.model });
        }
        let pre_name = match &self.pre {
            Some(p) => p.as_str(),
            None => {
                tracing::warn!("{KEY_PRE} is missing: using the GPT-2 pre-tokenizer ('default'); output may be degraded");
                "default"
            }
        };
        let spec = pretokenizer::spec_for(pre_name)?;

        let n = self.tokens.len();
        if n == 0 {
            return Err(TokenizerError::bad(KEY_TOKENS, "the vocabulary is empty"));
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::bad(
                KEY_TOKENS,
                format!("{n} tokens do not fit u32 ids"),
            ));
        }
        if let Some((key, size)) = &self.arch_vocab_size {
            if *size > n as u64 {
                return Err(TokenizerError::bad(
                    key,
                    format!(
                        "vocabulary size {size} is larger than the {n} entries of {KEY_TOKENS}"
                    ),
                ));
            }
        }
        let types = self.token_types(n)?;

        let mut vocab = Vocab::with_capacity(n);
        let mut texts = Vec::with_capacity(n);
        for (id, text) in self.tokens.into_iter().enumerate() {
            let text = if text.is_empty() {
                tracing::warn!(
                    "{KEY_TOKENS}[{id}] is empty; naming it [EMPTY_{id}] as llama.cpp does"
                );
                format!("[EMPTY_{id}]")
            } else {
                text
            };
            if types[id] == TokenType::Byte {
                check_byte_token(id, &text)?;
            }
            if let Some(prev) = vocab.insert(text.clone(), id as u32) {
                return Err(TokenizerError::bad(
                    KEY_TOKENS,
                    format!("token {text:?} appears twice, at ids {prev} and {id}"),
                ));
            }
            texts.push(text);
        }

        let merges = parse_merges(
            self.merges
                .ok_or_else(|| TokenizerError::missing(KEY_MERGES))?,
        )?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(|e| TokenizerError::bad(KEY_MERGES, e.to_string()))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pretokenizer::build(&spec)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let mut special = Vec::new();
        let mut user_defined = Vec::new();
        for (id, ty) in types.iter().enumerate() {
            match ty {
                TokenType::Control | TokenType::Unknown => {
                    special.push(AddedToken::from(texts[id].clone(), true));
                }
                TokenType::UserDefined => {
                    user_defined.push(AddedToken::from(texts[id].clone(), false).normalized(false));
                }
                _ => {}
            }
        }
        inner
            .add_special_tokens(special)
            .map_err(TokenizerError::backend)?;
        inner
            .add_tokens(user_defined)
            .map_err(TokenizerError::backend)?;

        let id_of = |key: &str, v: Option<u64>| -> Result<Option<u32>, TokenizerError> {
            match v {
                Some(id) if id >= n as u64 => Err(TokenizerError::bad(
                    key,
                    format!("token id {id} is out of range for a vocabulary of {n} tokens"),
                )),
                Some(id) => Ok(Some(id as u32)),
                None => Ok(None),
            }
        };
        let bos = id_of(KEY_BOS, self.bos)?;
        let eos = id_of(KEY_EOS, self.eos)?;
        let eot = id_of(KEY_EOT, self.eot)?;
        let eom = id_of(KEY_EOM, self.eom)?;
        id_of(KEY_PAD, self.pad)?;
        id_of(KEY_UNK, self.unk)?;

        let mut eos_ids: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        eos_ids.extend(EOG_TEXTS.iter().filter_map(|t| inner.token_to_id(t)));

        // llama.cpp: BPE vocabularies add no BOS unless the pre-tokenizer family says so
        // (llama3) or the metadata does.
        let add_bos = self.add_bos.unwrap_or(spec.add_bos);
        let wrap = SpecialWrap {
            prepend: bos.filter(|_| add_bos),
            append: eos.filter(|_| self.add_eos.unwrap_or(false)),
        };
        if add_bos && bos.is_none() {
            tracing::warn!("{KEY_ADD_BOS} is true but {KEY_BOS} is missing: no BOS will be added");
        }

        let text_of = |id: Option<u32>| id.map(|i| texts[i as usize].clone());
        let (chat_template, chat_template_error) = match self.chat_template {
            None => (None, None),
            Some(src) => match ChatTemplate::new(&src, text_of(bos), text_of(eos)) {
                Ok(t) => (Some(t), None),
                Err(e) => {
                    tracing::warn!("{KEY_CHAT_TEMPLATE} does not parse, chat is disabled: {e}");
                    (None, Some(e.to_string()))
                }
            },
        };
        let mut tok = Tokenizer::assemble(inner, bos, eos_ids, wrap, chat_template)?;
        tok.chat_template_error = chat_template_error;
        Ok(tok)
    }

    /// Token types for `n` tokens: all normal when the key is absent.
    fn token_types(&self, n: usize) -> Result<Vec<TokenType>, TokenizerError> {
        let Some(raw) = &self.token_types else {
            return Ok(vec![TokenType::Normal; n]);
        };
        if raw.len() < n {
            return Err(TokenizerError::bad(
                KEY_TOKEN_TYPE,
                format!("has {} entries but {KEY_TOKENS} has {n}", raw.len()),
            ));
        }
        raw[..n]
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                TokenType::from_i64(t).ok_or_else(|| {
                    TokenizerError::bad(
                        KEY_TOKEN_TYPE,
                        format!("entry {i} is {t}, not a token type (0..=6)"),
                    )
                })
            })
            .collect()
    }
}

/// A byte token must read `<0xHH>` with two hex digits (llama.cpp #25969 crashed on `<0x-1>`).
fn check_byte_token(id: usize, text: &str) -> Result<(), TokenizerError> {
    let hex = text.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'));
    match hex {
        Some(h) if h.len() == 2 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(()),
        _ => Err(TokenizerError::bad(
            KEY_TOKENS,
            format!("token {id} has type byte but text {text:?} is not of the form <0xHH>"),
        )),
    }
}

/// `"a b"` → `("a", "b")`, splitting at the first space after the first character (as llama.cpp
/// does, so a left part may itself start with a space in non-byte-level vocabularies).
fn parse_merges(merges: Vec<String>) -> Result<Vec<(String, String)>, TokenizerError> {
    merges
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let first_len = m.chars().next().map_or(0, char::len_utf8);
            match m[first_len..].find(' ') {
                Some(pos) => {
                    let split = first_len + pos;
                    let right = &m[split + 1..];
                    if right.is_empty() {
                        Err(TokenizerError::bad(
                            KEY_MERGES,
                            format!("entry {i} {m:?} has an empty right part"),
                        ))
                    } else {
                        Ok((m[..split].to_string(), right.to_string()))
                    }
                }
                None => Err(TokenizerError::bad(
                    KEY_MERGES,
                    format!("entry {i} {m:?} is not two tokens separated by a space"),
                )),
            }
        })
        .collect()
}
