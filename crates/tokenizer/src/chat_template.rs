//! Chat templates: the Jinja templates models ship (GGUF `tokenizer.chat_template`, HF
//! `tokenizer_config.json`), rendered with minijinja the way HF `apply_chat_template` renders them.
//!
//! Matching HF (transformers' `ImmutableSandboxedEnvironment`) means:
//! - `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the template dropped;
//! - Python string/dict methods (`.strip()`, `.split()`, `.startswith()`, `.items()`, ...) through
//!   minijinja-contrib's pycompat callback, and `{% break %}`/`{% continue %}`;
//! - globals `raise_exception(msg)` (fails the render with `msg`) and `strftime_now(fmt)`;
//! - a `tojson` filter that prints like Python's `json.dumps(x, ensure_ascii=False)`: `", "` and
//!   `": "` separators, no HTML escaping, keys in insertion order, `indent`/`separators`/
//!   `sort_keys` keyword arguments;
//! - variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools` and
//!   `documents` (none) plus any extras the caller passes (e.g. `tools`, `enable_thinking`);
//! - messages normalized as transformers does: `null`-valued keys dropped, reasoning under
//!   `reasoning_content`/`thinking`/`reasoning` visible under both `reasoning_content` and
//!   `thinking`.
//!
//! HF's `{% generation %}` marker tags (assistant-mask tracking) are removed before parsing; they
//! do not change the rendered text.

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::TokenizerError;

/// Template name inside the environment.
const NAME: &str = "chat";

/// One chat message: `{"role": ..., "content": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A parsed chat template. `Send + Sync`; rendering does not mutate it.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn template_err(e: minijinja::Error) -> TokenizerError {
    // minijinja's Display carries the kind and the template line; add the chain of causes.
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    TokenizerError::Template(msg)
}

/// Drops HF's `{% generation %}` / `{% endgeneration %}` tags (with any `-` whitespace markers).
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        let Some(end_rel) = rest[start..].find("%}") else {
            break;
        };
        let end = start + end_rel + 2;
        let inner = rest[start + 2..end - 2]
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Parses `source`. `bos_token`/`eos_token` are the texts templates see as `bos_token` and
    /// `eos_token` (HF passes the tokenizer's special token strings).
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, TokenizerError> {
        let source = strip_generation_tags(source);
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_err)?,
        );
        env.set_unknown_method_callback(python_methods);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.clone())
            .map_err(template_err)?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// The template text (after removal of `{% generation %}` tags).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. With `add_generation_prompt`, the template appends the header of
    /// the assistant's next turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let messages =
            serde_json::to_value(messages).map_err(|e| TokenizerError::Template(e.to_string()))?;
        self.render_json(&messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Renders arbitrary JSON messages (tool calls, `null` contents, multi-part contents...) with
    /// extra template variables (`tools`, `enable_thinking`, ...), which override the defaults.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let messages = normalize_messages(messages)?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), messages);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert(
            "bos_token".into(),
            self.bos_token.clone().unwrap_or_default().into(),
        );
        ctx.insert(
            "eos_token".into(),
            self.eos_token.clone().unwrap_or_default().into(),
        );
        ctx.insert("tools".into(), serde_json::Value::Null);
        ctx.insert("documents".into(), serde_json::Value::Null);
        for (k, v) in extra {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self.env.get_template(NAME).map_err(template_err)?;
        tmpl.render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(template_err)
    }
}

/// Message keys under which a turn's reasoning may arrive; templates read `reasoning_content`
/// (GLM, DeepSeek, Qwen) or `thinking` (gpt-oss).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// What transformers does to messages before rendering: keys whose value is `null` are dropped
/// (templates test `is defined`, not `is none`), and reasoning given under any of
/// [`REASONING_FIELDS`] is copied to both `thinking` and `reasoning_content`.
fn normalize_messages(messages: &serde_json::Value) -> Result<serde_json::Value, TokenizerError> {
    use serde_json::Value as J;
    let J::Array(list) = messages else {
        return Err(TokenizerError::Template(format!(
            "messages must be a list, found {messages}"
        )));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let J::Object(m) = m else {
            return Err(TokenizerError::Template(format!(
                "message {i} must be an object, found {m}"
            )));
        };
        let m: serde_json::Map<String, J> = m
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reasoning = REASONING_FIELDS.iter().find_map(|f| m.get(*f)).cloned();
        let m = match reasoning {
            None => m,
            Some(r) => {
                // Python: {"thinking": r, **message, "reasoning_content": r}
                let mut aliased = serde_json::Map::new();
                aliased.insert("thinking".into(), r.clone());
                for (k, v) in m {
                    aliased.insert(k, v);
                }
                aliased.insert("reasoning_content".into(), r);
                aliased
            }
        };
        out.push(J::Object(m));
    }
    Ok(J::Array(out))
}

/// Python methods on template values: a few string methods minijinja-contrib lacks or spells
/// differently, then everything pycompat knows.
fn python_methods(
    state: &mut minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, minijinja::Error> {
    if let Some(s) = value.as_str() {
        let one_str = |what: &str| -> Result<String, minijinja::Error> {
            match args {
                [a] => a.as_str().map(str::to_string).ok_or_else(|| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("str.{what}() takes a string"),
                    )
                }),
                _ => Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("str.{what}() takes one argument"),
                )),
            }
        };
        match method {
            // Python's str.title(): a cased letter is upper-cased after an uncased character
            // (not only after whitespace), lower-cased after a cased one.
            "title" if args.is_empty() => {
                let mut out = String::with_capacity(s.len());
                let mut prev_cased = false;
                for c in s.chars() {
                    let cased = c.is_lowercase() || c.is_uppercase();
                    if cased && prev_cased {
                        out.extend(c.to_lowercase());
                    } else if cased {
                        out.extend(c.to_uppercase());
                    } else {
                        out.push(c);
                    }
                    prev_cased = cased;
                }
                return Ok(Value::from(out));
            }
            "removeprefix" => {
                let p = one_str(method)?;
                return Ok(Value::from(s.strip_prefix(p.as_str()).unwrap_or(s)));
            }
            "removesuffix" => {
                let p = one_str(method)?;
                return Ok(Value::from(s.strip_suffix(p.as_str()).unwrap_or(s)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `raise_exception(msg)`: the template rejects its input (e.g. roles out of order).
fn raise_exception(msg: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised: {msg}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC time formatted with a strftime subset.
fn strftime_now(fmt: String) -> Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    crate::strftime::format_utc(secs, &fmt)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
}

/// `x | tojson(indent=None, separators=None, sort_keys=False)`, printed as Python's json.dumps
/// with `ensure_ascii=False` (what transformers installs).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?; // always False-like output; accepted for compatibility
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 0 => Some(" ".repeat(n as usize)),
            Some(_) => Some(String::new()),
            None => Some(v.as_str().map(str::to_string).ok_or_else(|| {
                minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or string",
                )
            })?),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s
                .try_iter()?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .filter(|v: &Vec<String>| v.len() == 2)
                .ok_or_else(|| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            (parts[0].clone(), parts[1].clone())
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = crate::pyjson::Style {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    Ok(Value::from_safe_string(crate::pyjson::dumps(&json, &style)))
}
