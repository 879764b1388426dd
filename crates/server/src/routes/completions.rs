//! `POST /v1/completions`: prompt(s) → `n` choices each, streamed or collected.
//!
//! Order of checks: JSON shape, model name, parameter ranges, engine readiness, tokenization,
//! context length per prompt, then submission (429/503 from the engine). Choice `index` is
//! `prompt_index * n + i`, as OpenAI and vLLM number them.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mlaserve_engine::FinishReason;
use mlaserve_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::generate::{self, GeneratedToken, UsageTotals};
use crate::logprobs::CompletionLogprobsBuilder;
use crate::params::{
    check_logprobs, check_max_tokens, check_model, fit_max_tokens, sampling_plan, MaxTokensDefault,
};
use crate::protocol::{
    parse_prompt, CompletionChoice, CompletionChunk, CompletionRequest, CompletionResponse,
    PromptInput, UsageInfo,
};
use crate::sse::{sse_response, to_json, ChunkFormatter};
use crate::state::{unix_now, AppState};

use super::{request_id, tokenize};

/// Default `max_tokens` of OpenAI's completions endpoint.
const DEFAULT_MAX_TOKENS: usize = 16;

pub(crate) async fn completions(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let config = state.config();
    check_model(&state, req.model.as_deref())?;
    let prompts = parse_prompt(req.prompt.as_ref())?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "suffix is not supported.",
        ));
    }
    let logprobs = check_logprobs("logprobs", req.logprobs, config.max_logprobs)?;
    let max_tokens = check_max_tokens("max_tokens", req.max_tokens)?;
    let plan = sampling_plan(&req.sampling, logprobs, config)?;
    let echo = req.echo.unwrap_or(false);
    if echo && logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "echo together with logprobs is not supported (no prompt logprobs).",
        ));
    }

    let engine = state.ready_engine()?;
    let tokenizer = engine.tokenizer().clone();
    let max_model_len = state
        .max_model_len()
        .unwrap_or_else(|| engine.max_model_len());
    let add_special_tokens = req.add_special_tokens.unwrap_or(true);
    let mut jobs = Vec::with_capacity(prompts.len());
    let mut echoes = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let (tokens, text) = match prompt {
            PromptInput::Text(text) => {
                let (tokens, text) =
                    tokenize(&tokenizer, text, add_special_tokens, "prompt").await?;
                (tokens, echo.then_some(text))
            }
            PromptInput::Tokens(tokens) => {
                let text = if echo {
                    Some(
                        tokenizer
                            .decode(&tokens, false)
                            .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?,
                    )
                } else {
                    None
                };
                (tokens, text)
            }
        };
        let mut params = plan.params.clone();
        params.max_tokens = fit_max_tokens(
            max_tokens,
            MaxTokensDefault::Fixed(DEFAULT_MAX_TOKENS),
            tokens.len(),
            max_model_len,
            "prompt",
        )?;
        jobs.push((tokens, params));
        echoes.push(text.unwrap_or_default());
    }

    let id = request_id("cmpl");
    let model = config.served_model_name.clone();
    let created = unix_now();
    let n = plan.n;
    let choices = generate::submit(&state, engine, jobs, n)?;

    if plan.stream {
        let num_choices = choices.len();
        let formatter = CompletionChunks {
            id,
            created,
            model,
            tokenizer,
            echoes,
            n,
            wants_logprobs: logprobs.is_some(),
            is_echoed: vec![false; num_choices],
            logprobs: (0..num_choices)
                .map(|_| CompletionLogprobsBuilder::new(0))
                .collect(),
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
            let echo = &echoes[out.prompt_index];
            let logprobs = logprobs.map(|_| {
                let mut builder = CompletionLogprobsBuilder::new(echo.chars().count());
                for lp in out.tokens.iter().filter_map(|t| t.logprob.as_ref()) {
                    builder.push(&tokenizer, lp);
                }
                builder.logprobs
            });
            CompletionChoice {
                index: out.index,
                text: format!("{echo}{}", out.text),
                logprobs,
                finish_reason: Some(out.finish_reason.as_str()),
            }
        })
        .collect();
    let body = CompletionResponse {
        id,
        object: "text_completion",
        created,
        model,
        choices,
        usage: totals.info(),
    };
    Ok(Json(body).into_response())
}

/// Chunks of a streaming completion: each token's text (the echoed prompt before a choice's
/// first token), its logprobs, then a chunk with the finish reason.
struct CompletionChunks {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    /// Per prompt: the text to echo ("" without echo).
    echoes: Vec<String>,
    n: usize,
    wants_logprobs: bool,
    /// Per choice: whether its echo went out.
    is_echoed: Vec<bool>,
    logprobs: Vec<CompletionLogprobsBuilder>,
}

impl CompletionChunks {
    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<UsageInfo>) -> String {
        to_json(&CompletionChunk {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    /// The echo of choice `index`, once.
    fn take_echo(&mut self, index: usize) -> String {
        match self.is_echoed.get_mut(index) {
            Some(done) if !*done => {
                *done = true;
                let echo = self
                    .echoes
                    .get(index / self.n.max(1))
                    .cloned()
                    .unwrap_or_default();
                if let Some(builder) = self.logprobs.get_mut(index) {
                    *builder = CompletionLogprobsBuilder::new(echo.chars().count());
                }
                echo
            }
            _ => String::new(),
        }
    }
}

impl ChunkFormatter for CompletionChunks {
    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<String> {
        let echo = self.take_echo(index);
        let logprobs = match (&token.logprob, self.logprobs.get_mut(index)) {
            (Some(lp), Some(builder)) if self.wants_logprobs => {
                builder.push(&self.tokenizer, lp);
                Some(builder.take())
            }
            _ => None,
        };
        if echo.is_empty() && token.text.is_empty() && logprobs.is_none() {
            return None;
        }
        let text = echo + &token.text;
        Some(self.chunk(
            vec![CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason: None,
            }],
            None,
        ))
    }

    fn finish(&mut self, index: usize, reason: FinishReason) -> String {
        let text = self.take_echo(index);
        let choice = CompletionChoice {
            index,
            text,
            logprobs: None,
            finish_reason: Some(reason.as_str()),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: UsageInfo) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}
