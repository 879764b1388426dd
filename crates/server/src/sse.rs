//! Server-sent events: turns the merged events of a request's choices into `data: {json}` chunks,
//! then an optional usage chunk, then `data: [DONE]`.
//!
//! The endpoint-specific JSON comes from a [`ChunkFormatter`]; the framing, the order (opening
//! chunks, token chunks as they arrive, one finish chunk per choice, usage, `[DONE]`) and the
//! error path (an `{"error": ...}` event, then `[DONE]`, siblings aborted) live here. The stream
//! owns the engine requests: when the client disconnects, axum drops it and they are aborted.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use futures_util::stream::{self, SelectAll, StreamExt};
use futures_util::Stream;
use mlaserve_engine::{FinishReason, RequestEvent};

use crate::error::ApiError;
use crate::generate::{ChoiceEvent, GeneratedToken, MergedEvents, UsageTotals};
use crate::protocol::UsageInfo;

/// The JSON of each chunk of one endpoint.
pub(crate) trait ChunkFormatter: Send + 'static {
    /// Chunks sent before any token (chat: each choice's role).
    fn opening(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// The chunk for one token of choice `index`, or `None` to send nothing.
    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<String>;
    /// The last chunk of choice `index`.
    fn finish(&mut self, index: usize, reason: FinishReason) -> String;
    /// The usage chunk (sent only with `stream_options.include_usage`).
    fn usage(&mut self, usage: UsageInfo) -> String;
}

/// Serialize a chunk; our chunk types always serialize, but never panic if one did not.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|e| ApiError::internal(format!("cannot serialize a chunk: {e}")).to_json())
}

struct Driver<F> {
    events: MergedEvents,
    formatter: F,
    pending: VecDeque<String>,
    totals: UsageTotals,
    include_usage: bool,
    is_opened: bool,
    is_closed: bool,
}

impl<F: ChunkFormatter> Driver<F> {
    /// Queue the chunks of one event.
    fn on_event(
        &mut self,
        ChoiceEvent {
            index,
            prompt_index,
            event,
        }: ChoiceEvent,
    ) {
        match event {
            RequestEvent::Token { text, logprob, .. } => {
                if let Some(chunk) = self
                    .formatter
                    .token(index, GeneratedToken { text, logprob })
                {
                    self.pending.push_back(chunk);
                }
            }
            RequestEvent::Finished { reason, usage } => {
                self.totals.add(prompt_index, &usage);
                self.pending.push_back(self.formatter.finish(index, reason));
            }
            RequestEvent::Error(message) => {
                self.pending
                    .push_back(ApiError::internal(message).to_json());
                self.close();
            }
        }
    }

    /// `[DONE]` and nothing after it; unfinished choices are dropped, hence aborted.
    fn close(&mut self) {
        self.pending.push_back("[DONE]".to_owned());
        self.is_closed = true;
        self.events = SelectAll::new();
    }
}

/// The SSE body of a streaming request.
pub(crate) fn sse_response<F: ChunkFormatter>(
    events: MergedEvents,
    formatter: F,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let driver = Driver {
        events,
        formatter,
        pending: VecDeque::new(),
        totals: UsageTotals::default(),
        include_usage,
        is_opened: false,
        is_closed: false,
    };
    Sse::new(stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(data) = d.pending.pop_front() {
                return Some((Ok(Event::default().data(data)), d));
            }
            if d.is_closed {
                return None;
            }
            if !d.is_opened {
                d.is_opened = true;
                let opening = d.formatter.opening();
                d.pending.extend(opening);
                continue;
            }
            match d.events.next().await {
                Some(event) => d.on_event(event),
                None => {
                    if d.include_usage {
                        let usage = d.formatter.usage(d.totals.info());
                        d.pending.push_back(usage);
                    }
                    d.close();
                }
            }
        }
    }))
}
