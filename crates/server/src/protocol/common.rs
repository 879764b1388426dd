//! Fields and objects shared by `/v1/completions` and `/v1/chat/completions`.
//!
//! Requests keep polymorphic fields (`prompt`, `stop`, message `content`) as raw JSON values and
//! parse them here, so a wrong shape gets a message that names the field instead of serde's
//! "did not match any variant of untagged enum".

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::error::ApiError;

/// `stream_options` of a streaming request.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct StreamOptions {
    /// Send one last chunk, with empty `choices`, that carries the usage of the whole request.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields of both endpoints (flattened into each request). All optional: the defaults
/// are OpenAI's (temperature 1, top_p 1, no penalties).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct SamplingFields {
    pub n: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// vLLM extension; -1 or 0 disables it.
    pub top_k: Option<i64>,
    /// vLLM extension.
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// vLLM extension (HF-style; 1 disables it).
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    /// A string or an array of strings.
    pub stop: Option<Value>,
    /// vLLM extension.
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM extension.
    pub ignore_eos: Option<bool>,
    /// vLLM extension; default true.
    pub skip_special_tokens: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Accepted only where the engine can honour it (absent, 0).
    pub min_tokens: Option<i64>,
    /// Accepted only where the engine can honour it (absent, null or `{}`).
    pub logit_bias: Option<Value>,
    /// Accepted only where it equals `n` (vLLM V1 dropped `best_of` > n too).
    pub best_of: Option<i64>,
}

/// Parse `stop`: a string, an array of strings, or null. Empty strings are dropped (they would
/// match at once).
pub fn parse_stop(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::invalid_param("stop", "`stop` must be a string or an array of strings");
    let stops = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

/// One prompt of a completion request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// Parse `prompt`: a string, an array of strings, an array of token ids, or an array of
/// token-id arrays. Rejects an empty prompt anywhere (vLLM: "the prompt cannot be empty").
pub fn parse_prompt(value: Option<&Value>) -> Result<Vec<PromptInput>, ApiError> {
    const SHAPE: &str = "`prompt` must be a string, an array of strings, an array of token ids, or an array of token-id arrays";
    let empty = || ApiError::invalid_param("prompt", "the prompt cannot be empty");
    let prompts = match value {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param("prompt", "`prompt` is required"))
        }
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(empty()),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|v| PromptInput::Text(v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![PromptInput::Tokens(token_ids(items)?)]
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| {
                token_ids(v.as_array().map_or(&[][..], Vec::as_slice)).map(PromptInput::Tokens)
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid_param("prompt", SHAPE)),
    };
    let is_empty = |p: &PromptInput| match p {
        PromptInput::Text(s) => s.is_empty(),
        PromptInput::Tokens(t) => t.is_empty(),
    };
    if prompts.iter().any(is_empty) {
        return Err(empty());
    }
    Ok(prompts)
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "prompt",
                        format!("token id {v} is not an integer in 0..2^32"),
                    )
                })
        })
        .collect()
}

/// `usage` of a response.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl UsageInfo {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// An ordered `{token: logprob}` object (completions' `top_logprobs` entries).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenLogprobMap(pub Vec<(String, f32)>);

impl Serialize for TokenLogprobMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

/// JSON has no -inf: clamp like vLLM does.
pub fn finite_logprob(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        -9999.0
    }
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub parent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompt_shapes() {
        let p = |v: Value| parse_prompt(Some(&v));
        assert_eq!(
            p(json!("hi")).unwrap(),
            vec![PromptInput::Text("hi".into())]
        );
        assert_eq!(p(json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(
            p(json!([1, 2, 3])).unwrap(),
            vec![PromptInput::Tokens(vec![1, 2, 3])]
        );
        assert_eq!(
            p(json!([[1], [2, 3]])).unwrap(),
            vec![
                PromptInput::Tokens(vec![1]),
                PromptInput::Tokens(vec![2, 3])
            ]
        );
        for bad in [
            json!(""),
            json!([]),
            json!([[]]),
            json!(["a", ""]),
            json!([1, -2]),
            json!([1, 2.5]),
            json!(5),
            json!({"a": 1}),
            json!(["a", 1]),
            json!([4294967296u64]),
        ] {
            let err = p(bad.clone()).unwrap_err();
            assert_eq!(err.status.as_u16(), 400, "{bad}");
            assert_eq!(err.param.as_deref(), Some("prompt"));
        }
        assert!(parse_prompt(None).is_err());
    }

    #[test]
    fn stop_shapes() {
        assert_eq!(parse_stop(Some(&json!("x"))).unwrap(), vec!["x"]);
        assert_eq!(
            parse_stop(Some(&json!(["x", "", "yz"]))).unwrap(),
            vec!["x", "yz"]
        );
        assert!(parse_stop(None).unwrap().is_empty());
        assert!(parse_stop(Some(&json!([1]))).is_err());
        assert!(parse_stop(Some(&json!({}))).is_err());
    }

    #[test]
    fn logprob_map_keeps_order_and_clamps() {
        let m = TokenLogprobMap(vec![
            ("b".into(), -0.5),
            ("a".into(), finite_logprob(f32::NEG_INFINITY)),
        ]);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"b":-0.5,"a":-9999.0}"#
        );
    }
}
