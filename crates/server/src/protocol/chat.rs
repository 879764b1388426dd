//! `/v1/chat/completions` request and response bodies.

use mlaserve_tokenizer::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{SamplingFields, UsageInfo};
use crate::error::ApiError;

/// Body of `POST /v1/chat/completions`. Unknown fields are ignored.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; either is accepted.
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    /// Return the sampled token's logprob.
    pub logprobs: Option<bool>,
    /// Top-N alternatives per token, 0..=max_logprobs; needs `logprobs: true`.
    pub top_logprobs: Option<i64>,
    /// Render the assistant turn's opening (default true).
    pub add_generation_prompt: Option<bool>,
    /// vLLM extension: let the tokenizer add BOS on top of the template (default false: the
    /// template writes it).
    pub add_special_tokens: Option<bool>,
    /// Not supported beyond absent/empty: our templates get no tools.
    pub tools: Option<Value>,
    /// Only `{"type": "text"}` is supported.
    pub response_format: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// One incoming message: `content` is a string, null, or an array of `{"type": "text"}` parts.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
}

impl ChatMessageIn {
    /// Flatten `content` into the template's `{role, content}`; text parts join with "\n" as vLLM.
    pub fn to_chat_message(&self, index: usize) -> Result<ChatMessage, ApiError> {
        let param = format!("messages[{index}].content");
        let content = match &self.content {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for part in parts {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(text)) => texts.push(text),
                        (Some(kind), _) if kind != "text" => {
                            return Err(ApiError::invalid_param(
                                &param,
                                format!("content part type `{kind}` is not supported (text only)"),
                            ))
                        }
                        _ => {
                            return Err(ApiError::invalid_param(
                                &param,
                                "a content part must be {\"type\": \"text\", \"text\": \"...\"}",
                            ))
                        }
                    }
                }
                texts.join("\n")
            }
            Some(_) => {
                return Err(ApiError::invalid_param(
                    &param,
                    "`content` must be a string, null, or an array of text parts",
                ))
            }
        };
        if self.role.is_empty() {
            return Err(ApiError::invalid_param(
                &format!("messages[{index}].role"),
                "`role` must not be empty",
            ));
        }
        Ok(ChatMessage {
            role: self.role.clone(),
            content,
        })
    }
}

/// One `choices[].logprobs.content[]` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobToken {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprobToken>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatResponseMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// Non-streaming response.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageInfo,
}

/// `delta` of a chunk: the first carries the role, the others content; the last is empty.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// One SSE chunk; the usage chunk has empty `choices`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(v: Value) -> Result<ChatMessage, ApiError> {
        serde_json::from_value::<ChatMessageIn>(v)
            .unwrap()
            .to_chat_message(0)
    }

    #[test]
    fn content_shapes() {
        assert_eq!(
            msg(json!({"role": "user", "content": "hi"}))
                .unwrap()
                .content,
            "hi"
        );
        assert_eq!(
            msg(json!({"role": "assistant", "content": null}))
                .unwrap()
                .content,
            ""
        );
        assert_eq!(msg(json!({"role": "assistant"})).unwrap().content, "");
        let parts = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(msg(parts).unwrap().content, "a\nb");
        let image = msg(
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
        );
        assert!(image.unwrap_err().message.contains("image_url"));
        assert!(msg(json!({"role": "user", "content": 5})).is_err());
        assert!(msg(json!({"role": "", "content": "x"})).is_err());
        assert!(msg(json!({"role": "user", "content": [{"text": "no type"}]})).is_err());
    }

    #[test]
    fn delta_skips_absent_fields() {
        let d = ChatDelta {
            role: Some("assistant"),
            content: Some(String::new()),
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"role":"assistant","content":""}"#
        );
        assert_eq!(serde_json::to_string(&ChatDelta::default()).unwrap(), "{}");
    }
}
