//! `/v1/completions` request and response bodies (OpenAI's legacy completions, vLLM's extensions).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{SamplingFields, TokenLogprobMap, UsageInfo};

/// Body of `POST /v1/completions`. Unknown fields are ignored.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// A string, an array of strings, an array of token ids, or an array of token-id arrays.
    pub prompt: Option<Value>,
    /// Default 16, as OpenAI's.
    pub max_tokens: Option<i64>,
    /// Top-N logprobs per generated token, 0..=max_logprobs.
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the returned text.
    pub echo: Option<bool>,
    /// Not supported (must be absent or empty).
    pub suffix: Option<String>,
    /// vLLM extension: add the BOS token to text prompts (default true).
    pub add_special_tokens: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `choices[].logprobs` of a completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    /// Character offset of each token's text in the choice's text.
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    pub top_logprobs: Vec<Option<TokenLogprobMap>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// Non-streaming response.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: UsageInfo,
}

/// One SSE chunk of a streaming response; the usage chunk has empty `choices`.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageInfo>,
}
