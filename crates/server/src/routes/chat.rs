//! `POST /v1/chat/completions`: messages → the model's chat template → tokens → `n` choices.
//!
//! The rendered template already holds the special tokens the model expects (BOS, role markers),
//! so it is tokenized without adding special tokens unless `add_special_tokens` asks for it.
//! Without `max_tokens`/`max_completion_tokens` a choice may fill the rest of the context window.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mlaserve_engine::FinishReason;
use mlaserve_tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::generate::{self, GeneratedToken, UsageTotals};
use crate::logprobs::chat_logprob;
use crate::params::{
    check_logprobs, check_max_tokens, check_model, fit_max_tokens, sampling_plan, MaxTokensDefault,
};
use crate::protocol::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatResponseMessage, UsageInfo,
};
use crate::sse::{sse_response, to_json, ChunkFormatter};
use crate::state::{unix_now, AppState};

use super::{request_id, tokenize};

pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let config = state.config();
    check_model(&state, req.model.as_deref())?;
    let messages = match &req.messages {
        None => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` is required",
            ))
        }
        Some(m) if m.is_empty() => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must not be empty",
            ))
        }
        Some(m) => m
            .iter()
            .enumerate()
            .map(|(i, m)| m.to_chat_message(i))
            .collect::<Result<Vec<ChatMessage>, _>>()?,
    };
    check_unsupported(&req)?;
    let wants_logprobs = req.logprobs.unwrap_or(false);
    let top_logprobs = check_logprobs("top_logprobs", req.top_logprobs, config.max_logprobs)?;
    if top_logprobs.is_some_and(|k| k > 0) && !wants_logprobs {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "when using `top_logprobs`, `logprobs` must be set to true.",
        ));
    }
    let top_n = top_logprobs.unwrap_or(0);
    let (max_param, requested) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    let max_tokens = check_max_tokens(max_param, requested)?;
    let plan = sampling_plan(&req.sampling, wants_logprobs.then_some(top_n), config)?;

    let engine = state.ready_engine()?;
    let tokenizer = engine.tokenizer().clone();
    let template =
        tokenizer
            .chat_template()
            .ok_or_else(|| match tokenizer.chat_template_error() {
                Some(e) => ApiError::bad_request(format!(
                    "the model's chat template does not parse ({e}); use /v1/completions"
                )),
                None => {
                    ApiError::bad_request("the model has no chat template; use /v1/completions")
                }
            })?;
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let text = template
        .render(&messages, add_generation_prompt)
        .map_err(|e| {
            ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}"))
        })?;
    let (tokens, _) = tokenize(
        &tokenizer,
        text,
        req.add_special_tokens.unwrap_or(false),
        "messages",
    )
    .await?;
    if tokens.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "the conversation renders to an empty prompt",
        ));
    }
    let max_model_len = state
        .max_model_len()
        .unwrap_or_else(|| engine.max_model_len());
    let mut params = plan.params.clone();
    params.max_tokens = fit_max_tokens(
        max_tokens,
        MaxTokensDefault::RestOfContext,
        tokens.len(),
        max_model_len,
        "messages",
    )?;

    let id = request_id("chatcmpl");
    let model = config.served_model_name.clone();
    let created = unix_now();
    let choices = generate::submit(&state, engine, vec![(tokens, params)], plan.n)?;

    if plan.stream {
        let formatter = ChatChunks {
            id,
            created,
            model,
            tokenizer,
            num_choices: choices.len(),
            wants_logprobs,
            top_n,
        };
        return Ok(
            sse_response(generate::merge(choices), formatter, plan.include_usage).into_response(),
        );
    }

    let outputs = generate::collect_all(choices).await?;
    let mut totals = UsageTotals::default();
    let choices = outputs
        .into_iter()
        .map(|out| {
            totals.add(out.prompt_index, &out.usage);
            let logprobs = wants_logprobs.then(|| ChatLogprobs {
                content: out
                    .tokens
                    .iter()
                    .filter_map(|t| t.logprob.as_ref())
                    .map(|lp| chat_logprob(&tokenizer, lp, top_n))
                    .collect(),
            });
            ChatChoice {
                index: out.index,
                message: ChatResponseMessage {
                    role: "assistant",
                    content: out.text,
                },
                logprobs,
                finish_reason: Some(out.finish_reason.as_str()),
            }
        })
        .collect();
    let body = ChatCompletionResponse {
        id,
        object: "chat.completion",
        created,
        model,
        choices,
        usage: totals.info(),
    };
    Ok(Json(body).into_response())
}

/// Fields we accept only in their neutral form.
fn check_unsupported(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    let has_tools = match &req.tools {
        None | Some(Value::Null) => false,
        Some(Value::Array(tools)) => !tools.is_empty(),
        Some(_) => true,
    };
    if has_tools {
        return Err(ApiError::invalid_param("tools", "tools are not supported."));
    }
    if let Some(format) = &req.response_format {
        let kind = format.get("type").and_then(Value::as_str);
        if !format.is_null() && kind != Some("text") {
            return Err(ApiError::invalid_param(
                "response_format",
                "only response_format {\"type\": \"text\"} is supported.",
            ));
        }
    }
    Ok(())
}

/// Chunks of a streaming chat completion: the role of every choice first, then content deltas,
/// then a chunk with an empty delta and the finish reason.
struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    num_choices: usize,
    wants_logprobs: bool,
    top_n: usize,
}

impl ChatChunks {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageInfo>) -> String {
        to_json(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }
}

impl ChunkFormatter for ChatChunks {
    fn opening(&mut self) -> Vec<String> {
        (0..self.num_choices)
            .map(|index| {
                let delta = ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                };
                self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta,
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )
            })
            .collect()
    }

    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<String> {
        let logprobs = match &token.logprob {
            Some(lp) if self.wants_logprobs => Some(ChatLogprobs {
                content: vec![chat_logprob(&self.tokenizer, lp, self.top_n)],
            }),
            _ => None,
        };
        if token.text.is_empty() && logprobs.is_none() {
            return None;
        }
        let delta = ChatDelta {
            role: None,
            content: Some(token.text),
        };
        Some(self.chunk(
            vec![ChatChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason: None,
            }],
            None,
        ))
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> String {
        let choice = ChatChunkChoice {
            index,
            delta: ChatDelta::default(),
            logprobs: None,
            finish_reason: Some(reason.as_str()),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: UsageInfo) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
