//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
//!
//! Every failure a handler can meet becomes an [`ApiError`] with its HTTP status; nothing a client
//! sends makes a handler panic. Messages name the offending parameter and value. Engine failures
//! map as: queue full → 429 with `Retry-After`, engine shut down → 503, a prompt over the context
//! window → 400 with vLLM's wording, an invalid request → 400, a model failure → 500.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mlaserve_engine::EngineError;
use serde::Serialize;

/// One client-visible error: the HTTP status plus OpenAI's error object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error`, `rate_limit_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Seconds for the `Retry-After` header (429 and 503 only).
    pub retry_after_secs: Option<u32>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_secs: None,
        }
    }

    /// 400 without a specific parameter (malformed JSON, empty prompt, ...).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the parameter at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            code: Some("invalid_value"),
            ..Self::bad_request(message)
        }
    }

    /// 400: prompt plus completion do not fit the context window.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            code: Some("context_length_exceeded"),
            ..Self::bad_request(message)
        }
    }

    /// 404 for a `model` other than the served one.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!("The model `{model}` does not exist."),
            )
        }
    }

    /// 404 for an unknown route.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route for {method} {path}"),
        )
    }

    /// 405 for a known route called with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("method {method} is not allowed on {path}"),
        )
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or invalid API key",
            )
        }
    }

    /// 413: the body is larger than the configured limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body is larger than {limit} bytes"),
        )
    }

    /// 429: the engine's waiting queue is full.
    pub fn queue_full(retry_after_secs: u32) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after_secs: Some(retry_after_secs),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "the server's request queue is full; retry later",
            )
        }
    }

    /// 503: the engine is still loading or has shut down.
    pub fn unavailable(message: impl Into<String>, retry_after_secs: u32) -> Self {
        Self {
            retry_after_secs: Some(retry_after_secs),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable_error",
                message,
            )
        }
    }

    /// 500: a failure on our side (model error, engine died mid-request).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Map an error of [`mlaserve_engine::EngineHandle::add`].
    pub fn from_engine(err: EngineError, retry_after_secs: u32) -> Self {
        match err {
            EngineError::QueueFull => Self::queue_full(retry_after_secs),
            EngineError::InvalidRequest(msg) => Self::bad_request(msg),
            EngineError::PromptTooLong { prompt, max } => {
                Self::context_length("prompt", prompt_too_long_message(prompt, max))
            }
            EngineError::Shutdown => {
                Self::unavailable("the engine has shut down", retry_after_secs)
            }
            EngineError::Model(msg) => Self::internal(format!("model error: {msg}")),
        }
    }

    fn object(&self) -> ErrorObject<'_> {
        ErrorObject {
            message: &self.message,
            kind: self.kind,
            param: self.param.as_deref(),
            code: self.code,
        }
    }

    /// `{"error": {...}}` as JSON text (also the data of an SSE error event).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&ErrorBody {
            error: self.object(),
        })
        .unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#
                .to_owned()
        })
    }
}

/// vLLM's wording for a prompt that alone fills the context window.
pub fn prompt_too_long_message(prompt_tokens: usize, max_model_len: usize) -> String {
    format!(
        "This model's maximum context length is {max_model_len} tokens. However, your request has \
         {prompt_tokens} input tokens. Please reduce the length of the input messages."
    )
}

/// vLLM's wording for a `max_tokens` that does not fit beside the prompt.
pub fn max_tokens_too_large_message(
    max_tokens: usize,
    max_model_len: usize,
    prompt_tokens: usize,
) -> String {
    format!(
        "'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum \
         context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens \
         ({max_tokens} > {max_model_len} - {prompt_tokens})."
    )
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.to_json();
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses() {
        let cases = [
            (EngineError::QueueFull, 429),
            (
                EngineError::InvalidRequest("token id 9999 out of range".into()),
                400,
            ),
            (
                EngineError::PromptTooLong {
                    prompt: 300,
                    max: 256,
                },
                400,
            ),
            (EngineError::Shutdown, 503),
            (EngineError::Model("nan".into()), 500),
        ];
        for (err, status) in cases {
            assert_eq!(ApiError::from_engine(err, 1).status.as_u16(), status);
        }
    }

    #[test]
    fn queue_full_carries_retry_after() {
        let response = ApiError::from_engine(EngineError::QueueFull, 3).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
    }

    #[test]
    fn messages_use_vllm_wording() {
        assert_eq!(
            max_tokens_too_large_message(8000, 4096, 2778),
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context \
             length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778)."
        );
        assert!(prompt_too_long_message(4176, 1536).starts_with(
            "This model's maximum context length is 1536 tokens. However, your request has 4176 input tokens."
        ));
    }
}
