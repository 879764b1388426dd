//! Loading a tokenizer from an HF model directory.
//!
//! Files, in order of authority:
//! - `tokenizer.json` (required): the whole `tokenizers` pipeline, added tokens included;
//! - `tokenizer_config.json` (optional): `bos_token`/`eos_token` (strings or `{"content": ..}`),
//!   `add_bos_token`/`add_eos_token`, `chat_template` (a string, or a list of
//!   `{"name", "template"}` of which "default" is used);
//! - `chat_template.jinja` (optional): newer transformers save the template here; it wins over
//!   the config's;
//! - `generation_config.json` (optional, else `config.json`): `eos_token_id` (an id or a list) and
//!   `bos_token_id`.
//!
//! Invariant: `eos_ids()` is the union of the config's `eos_token` and every generation EOS id,
//! so generation stops wherever transformers' `generate` would.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::tokenizer::SpecialWrap;
use crate::{ChatTemplate, Tokenizer, TokenizerError};

fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(TokenizerError::Io {
                path: path.to_path_buf(),
                source: e,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::BadFile {
            path: path.to_path_buf(),
            reason: format!("invalid JSON: {e}"),
        })
}

fn bad(path: &Path, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::BadFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// A special-token entry: `"<s>"` or `{"content": "<s>", ...}` or null.
fn token_text(path: &Path, key: &str, v: Option<&Value>) -> Result<Option<String>, TokenizerError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(bad(
                path,
                format!("`{key}` is an object without a string `content`"),
            )),
        },
        Some(other) => Err(bad(
            path,
            format!("`{key}` must be a string or an object, found {other}"),
        )),
    }
}

/// A token id field: an id, a list of ids, or absent.
fn ids_field(path: &Path, key: &str, v: Option<&Value>) -> Result<Vec<u32>, TokenizerError> {
    let one = |x: &Value| {
        x.as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| bad(path, format!("`{key}` entry {x} is not a token id")))
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(x) => Ok(vec![one(x)?]),
    }
}

fn opt_bool(path: &Path, key: &str, v: Option<&Value>) -> Result<Option<bool>, TokenizerError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(path, format!("`{key}` must be a bool, found {other}"))),
    }
}

/// The chat template: `chat_template.jinja`, else the config's `chat_template`.
fn chat_template_source(
    dir: &Path,
    config_path: &Path,
    config: &Value,
) -> Result<Option<String>, TokenizerError> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(t) => return Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(TokenizerError::Io {
                path: jinja,
                source: e,
            })
        }
    }
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |name: &str| {
                list.iter()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
            };
            match named("default").or_else(|| list.first()) {
                None => Ok(None),
                Some(e) => e
                    .get("template")
                    .and_then(Value::as_str)
                    .map(|s| Some(s.to_string()))
                    .ok_or_else(|| {
                        bad(
                            config_path,
                            "`chat_template` list entry has no string `template`",
                        )
                    }),
            }
        }
        Some(other) => Err(bad(
            config_path,
            format!("`chat_template` must be a string or a list, found {other}"),
        )),
    }
}

fn lookup(
    tok: &tokenizers::Tokenizer,
    path: &Path,
    key: &str,
    text: &Option<String>,
) -> Result<Option<u32>, TokenizerError> {
    match text {
        None => Ok(None),
        Some(t) => tok.token_to_id(t).map(Some).ok_or_else(|| {
            bad(
                path,
                format!("`{key}` {t:?} is not in the vocabulary of tokenizer.json"),
            )
        }),
    }
}

pub(crate) fn load(dir: &Path) -> Result<Tokenizer, TokenizerError> {
    let tj: PathBuf = dir.join("tokenizer.json");
    if !tj.is_file() {
        return Err(TokenizerError::Io {
            path: tj,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json not found"),
        });
    }
    let inner = tokenizers::Tokenizer::from_file(&tj).map_err(|e| bad(&tj, e.to_string()))?;

    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = read_json(&cfg_path)?.unwrap_or(Value::Object(Default::default()));
    let bos_text = token_text(&cfg_path, "bos_token", cfg.get("bos_token"))?;
    let eos_text = token_text(&cfg_path, "eos_token", cfg.get("eos_token"))?;
    let add_bos = opt_bool(&cfg_path, "add_bos_token", cfg.get("add_bos_token"))?;
    let add_eos = opt_bool(&cfg_path, "add_eos_token", cfg.get("add_eos_token"))?;

    let gen_path = dir.join("generation_config.json");
    let (gen_path, gen) = match read_json(&gen_path)? {
        Some(g) => (gen_path, g),
        None => {
            let p = dir.join("config.json");
            let g = read_json(&p)?.unwrap_or(Value::Null);
            (p, g)
        }
    };

    let mut bos_id = lookup(&inner, &cfg_path, "bos_token", &bos_text)?;
    if bos_id.is_none() {
        bos_id = ids_field(&gen_path, "bos_token_id", gen.get("bos_token_id"))?
            .first()
            .copied();
    }
    let eos_id = lookup(&inner, &cfg_path, "eos_token", &eos_text)?;
    let mut eos_ids = ids_field(&gen_path, "eos_token_id", gen.get("eos_token_id"))?;
    for &id in eos_ids.iter().chain(&bos_id) {
        if inner.id_to_token(id).is_none() {
            return Err(bad(
                &gen_path,
                format!("token id {id} is out of range of tokenizer.json's vocabulary"),
            ));
        }
    }
    eos_ids.extend(eos_id);

    // add_bos_token/add_eos_token: add them ourselves only where tokenizer.json's post-processor
    // does not already (older transformers rebuilt the post-processor from these flags).
    let probe_with = inner
        .encode_fast("a", true)
        .map_err(TokenizerError::backend)?;
    let probe_without = inner
        .encode_fast("a", false)
        .map_err(TokenizerError::backend)?;
    let adds_first = probe_with.get_ids().len() > probe_without.get_ids().len()
        && probe_with.get_ids().first() != probe_without.get_ids().first();
    let adds_last = probe_with.get_ids().len() > probe_without.get_ids().len()
        && probe_with.get_ids().last() != probe_without.get_ids().last();
    let wrap = SpecialWrap {
        prepend: bos_id.filter(|_| add_bos == Some(true) && !adds_first),
        append: eos_id.filter(|_| add_eos == Some(true) && !adds_last),
    };

    let (chat_template, chat_template_error) = match chat_template_source(dir, &cfg_path, &cfg)? {
        None => (None, None),
        Some(src) => match ChatTemplate::new(&src, bos_text.clone(), eos_text.clone()) {
            Ok(t) => (Some(t), None),
            Err(e) => {
                tracing::warn!(
                    "{}: chat template does not parse, chat is disabled: {e}",
                    dir.display()
                );
                (None, Some(e.to_string()))
            }
        },
    };
    let mut tok = Tokenizer::assemble(inner, bos_id, eos_ids, wrap, chat_template)?;
    tok.chat_template_error = chat_template_error;
    Ok(tok)
}
