//! What a caller sends the engine and what comes back on the request's stream.
//!
//! Every accepted request's stream ends with exactly one `Finished` or `Error` event (unless
//! the caller dropped the stream first, which aborts the request). Dropping a
//! [`RequestStream`] aborts its request: the engine sees the closed channel at its next step
//! and frees the request's blocks.

use tokio::sync::mpsc::UnboundedReceiver;

use crate::sampling_params::SamplingParams;

/// Engine-wide unique id of a request.
pub type RequestId = u64;

/// A tokenized prompt and how to continue it.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_tokens: Vec<u32>,
    pub params: SamplingParams,
}

/// Log-probabilities of one sampled token (log_softmax of the raw logits).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
    /// The `logprobs` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` reached, or the context (`max_model_len`) is full.
    Length,
    /// Aborted by the caller (or engine shutdown before completion).
    Abort,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache at the request's first admission.
    pub cached_prompt_tokens: usize,
}

/// One event on a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// A generated token. `text` is the newly releasable detokenized text, which may be
    /// empty (incomplete UTF-8, a special token, text withheld as a possible stop-string
    /// prefix, or the stop string itself).
    Token {
        token_id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The request is done; nothing follows.
    Finished { reason: FinishReason, usage: Usage },
    /// The request failed (e.g. the forward pass errored); nothing follows.
    Error(String),
}

/// The receiving end of one request. Dropping it aborts the request.
#[derive(Debug)]
pub struct RequestStream {
    pub id: RequestId,
    pub(crate) rx: UnboundedReceiver<RequestEvent>,
}

impl RequestStream {
    /// Next event; `None` once the engine has dropped its sender (after the final event).
    pub async fn recv(&mut self) -> Option<RequestEvent> {
        self.rx.recv().await
    }

    /// Blocking variant of [`recv`](Self::recv); must not be called inside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<RequestEvent> {
        self.rx.blocking_recv()
    }
}
