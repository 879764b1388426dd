//! Talking to the engine: fan a request out into one engine request per choice, then either
//! collect every choice (non-streaming) or merge their events as they come (streaming).
//!
//! Invariant: a choice's [`RequestStream`] lives exactly as long as someone can still use its
//! output. It is owned by the handler future (non-streaming) or by the SSE body (streaming), so
//! a client that disconnects drops it, and dropping it aborts the engine request; [`Tracked`]
//! also calls `abort` explicitly so a request still waiting in the queue is freed at once.
//! The first failing choice drops its siblings, which aborts them too.

use std::time::Instant;

use futures_util::future::try_join_all;
use futures_util::stream::{self, SelectAll};
use futures_util::Stream;
use mlaserve_engine::{
    EngineHandle, FinishReason, GenerateRequest, RequestEvent, RequestStream, SamplingParams,
    TokenLogprob, Usage,
};

use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::protocol::UsageInfo;
use crate::state::AppState;

/// One engine request of an HTTP request.
pub(crate) struct Choice {
    /// `choices[].index`: prompt_index * n + i.
    pub index: usize,
    pub prompt_index: usize,
    stream: Tracked,
}

/// A [`RequestStream`] that records TTFT, TPOT, latency and outcome in the server metrics.
struct Tracked {
    inner: RequestStream,
    engine: EngineHandle,
    state: AppState,
    started: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    num_events: usize,
    prompt_tokens: usize,
    is_done: bool,
}

impl Tracked {
    async fn next(&mut self) -> Option<RequestEvent> {
        if self.is_done {
            return None;
        }
        let event = self.inner.recv().await;
        let now = Instant::now();
        match &event {
            Some(RequestEvent::Token { .. }) => {
                if self.first_token.is_none() {
                    self.first_token = Some(now);
                    self.state.metrics().record_first_token(now - self.started);
                }
                self.last_token = Some(now);
                self.num_events += 1;
            }
            Some(RequestEvent::Finished { reason, usage }) => {
                self.is_done = true;
                let tpot = match (self.first_token, self.last_token) {
                    (Some(first), Some(last)) if usage.completion_tokens > 1 => {
                        Some((last - first) / (usage.completion_tokens as u32 - 1))
                    }
                    _ => None,
                };
                let metrics = self.state.metrics();
                metrics.record_outcome(
                    Outcome::Finished(*reason),
                    now - self.started,
                    tpot,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                );
            }
            Some(RequestEvent::Error(_)) | None => {
                self.is_done = true;
                let metrics = self.state.metrics();
                metrics.record_outcome(
                    Outcome::Error,
                    now - self.started,
                    None,
                    self.prompt_tokens,
                    self.num_events,
                );
            }
        }
        event
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.is_done {
            self.engine.abort(self.inner.id);
            let elapsed = self.started.elapsed();
            self.state.metrics().record_outcome(
                Outcome::Dropped,
                elapsed,
                None,
                self.prompt_tokens,
                self.num_events,
            );
        }
    }
}

/// Submit `n` engine requests per prompt, seeds `seed + i` (as vLLM's parallel sampling).
/// `prompts[p] = (token ids, params with that prompt's max_tokens)`. On the first refusal the
/// ones already submitted are dropped, hence aborted.
pub(crate) fn submit(
    state: &AppState,
    engine: &EngineHandle,
    prompts: Vec<(Vec<u32>, SamplingParams)>,
    n: usize,
) -> Result<Vec<Choice>, ApiError> {
    let retry = state.config().retry_after_secs;
    let mut choices = Vec::with_capacity(prompts.len() * n);
    for (prompt_index, (tokens, params)) in prompts.into_iter().enumerate() {
        for i in 0..n {
            let mut params = params.clone();
            params.seed = params.seed.map(|s| s.wrapping_add(i as u64));
            let prompt_tokens = tokens.len();
            let request = GenerateRequest {
                prompt_tokens: tokens.clone(),
                params,
            };
            let inner = engine
                .add(request)
                .map_err(|e| ApiError::from_engine(e, retry))?;
            let stream = Tracked {
                inner,
                engine: engine.clone(),
                state: state.clone(),
                started: Instant::now(),
                first_token: None,
                last_token: None,
                num_events: 0,
                prompt_tokens,
                is_done: false,
            };
            choices.push(Choice {
                index: prompt_index * n + i,
                prompt_index,
                stream,
            });
        }
    }
    Ok(choices)
}

/// One generated token as the engine reported it.
#[derive(Debug, Clone)]
pub(crate) struct GeneratedToken {
    /// Detokenized delta (may be empty while a stop string is undecided).
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

/// Everything one choice produced.
#[derive(Debug, Clone)]
pub(crate) struct ChoiceOutput {
    pub index: usize,
    pub prompt_index: usize,
    pub text: String,
    pub tokens: Vec<GeneratedToken>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
}

async fn collect_one(mut choice: Choice) -> Result<ChoiceOutput, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    loop {
        match choice.stream.next().await {
            Some(RequestEvent::Token {
                text: delta,
                logprob,
                ..
            }) => {
                text.push_str(&delta);
                tokens.push(GeneratedToken {
                    text: delta,
                    logprob,
                });
            }
            Some(RequestEvent::Finished { reason, usage }) => {
                return Ok(ChoiceOutput {
                    index: choice.index,
                    prompt_index: choice.prompt_index,
                    text,
                    tokens,
                    finish_reason: reason,
                    usage,
                })
            }
            Some(RequestEvent::Error(message)) => return Err(ApiError::internal(message)),
            None => {
                return Err(ApiError::internal(
                    "the engine stopped before the request finished",
                ))
            }
        }
    }
}

/// Wait for every choice; outputs in choice order. The first error drops (aborts) the rest.
pub(crate) async fn collect_all(choices: Vec<Choice>) -> Result<Vec<ChoiceOutput>, ApiError> {
    let mut outputs = try_join_all(choices.into_iter().map(collect_one)).await?;
    outputs.sort_by_key(|o| o.index);
    Ok(outputs)
}

/// Usage of a whole request: each prompt's tokens once (however many choices it fans out to),
/// every choice's completion tokens.
#[derive(Debug, Default)]
pub(crate) struct UsageTotals {
    counted_prompts: Vec<usize>,
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
}

impl UsageTotals {
    pub fn add(&mut self, prompt_index: usize, usage: &Usage) {
        if !self.counted_prompts.contains(&prompt_index) {
            self.counted_prompts.push(prompt_index);
            self.prompt_tokens += usage.prompt_tokens;
            self.cached_tokens += usage.cached_prompt_tokens;
        }
        self.completion_tokens += usage.completion_tokens;
    }

    pub fn info(&self) -> UsageInfo {
        UsageInfo::new(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
        )
    }
}

/// An event of one choice in a merged stream.
pub(crate) struct ChoiceEvent {
    pub index: usize,
    pub prompt_index: usize,
    pub event: RequestEvent,
}

pub(crate) type MergedEvents = SelectAll<std::pin::Pin<Box<dyn Stream<Item = ChoiceEvent> + Send>>>;

/// Every choice's events, interleaved as they arrive. Each choice's sub-stream ends after its
/// `Finished` or `Error`; dropping the merged stream drops (aborts) the unfinished choices.
pub(crate) fn merge(choices: Vec<Choice>) -> MergedEvents {
    stream::select_all(choices.into_iter().map(|choice| {
        let s = stream::unfold(choice, |mut choice| async move {
            let event = choice.stream.next().await?;
            Some((
                ChoiceEvent {
                    index: choice.index,
                    prompt_index: choice.prompt_index,
                    event,
                },
                choice,
            ))
        });
        Box::pin(s) as std::pin::Pin<Box<dyn Stream<Item = ChoiceEvent> + Send>>
    }))
}
