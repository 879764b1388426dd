//! [`JsonBody`]: a JSON extractor whose rejections are OpenAI-shaped errors.
//!
//! axum's own `Json` answers bad bodies in plain text and insists on a JSON content type; this
//! one accepts any content type (as vLLM's clients rely on), caps the body at
//! `ServerConfig::max_body_bytes` (413 beyond it) and reports malformed JSON or wrong field
//! types as 400 with serde's message, which names the line, column and expected type.

use axum::extract::{FromRequest, Request};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// A request body parsed as `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.config().max_body_bytes;
        let mut body = request.into_body().into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
            if bytes.len() + chunk.len() > limit {
                return Err(ApiError::payload_too_large(limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}
