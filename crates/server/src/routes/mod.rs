//! Route handlers. The generation routes live in their own files; the small ones are here.

pub(crate) mod chat;
pub(crate) mod completions;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use mlaserve_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::protocol::{ModelCard, ModelList};
use crate::state::AppState;

/// `GET /health`: 200 once the engine is installed, 503 while the model loads.
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    if state.is_ready() {
        StatusCode::OK.into_response()
    } else {
        ApiError::unavailable(
            "the model is still loading",
            state.config().retry_after_secs,
        )
        .into_response()
    }
}

/// `GET /v1/models`: the one served model.
pub(crate) async fn models(State(state): State<AppState>) -> Json<ModelList> {
    let name = state.config().served_model_name.clone();
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: name.clone(),
            object: "model",
            created: state.started_at(),
            owned_by: "mlaserve",
            root: name,
            parent: None,
            max_model_len: state.max_model_len(),
        }],
    })
}

/// `GET /version`.
pub(crate) async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }))
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let engine = state.engine().map(|e| e.metrics());
    let body = state
        .metrics()
        .render(&state.config().served_model_name, engine.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::route_not_found(method.as_str(), uri.path())
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// Middleware on every route: the API key check for `/v1/*` and the response counter.
pub(crate) async fn gate_and_count(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let response = if is_authorized(&state, &request) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    };
    state
        .metrics()
        .record_http(&route, response.status().as_u16());
    response
}

fn is_authorized(state: &AppState, request: &Request) -> bool {
    let Some(key) = state.config().api_key.as_deref() else {
        return true;
    };
    if !request.uri().path().starts_with("/v1/") {
        return true;
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer == Some(key)
}

/// Texts at least this long are tokenized on tokio's blocking pool.
const BLOCKING_TOKENIZE_BYTES: usize = 16 << 10;

/// Text → token ids (the text comes back for echo). A long text is tokenized on the blocking
/// pool, so one huge prompt does not stall a runtime worker that other connections share.
pub(crate) async fn tokenize(
    tokenizer: &Arc<Tokenizer>,
    text: String,
    add_special_tokens: bool,
    param: &str,
) -> Result<(Vec<u32>, String), ApiError> {
    let (ids, text) = if text.len() < BLOCKING_TOKENIZE_BYTES {
        (tokenizer.encode(&text, add_special_tokens), text)
    } else {
        let tokenizer = tokenizer.clone();
        tokio::task::spawn_blocking(move || (tokenizer.encode(&text, add_special_tokens), text))
            .await
            .map_err(|e| ApiError::internal(format!("tokenization task failed: {e}")))?
    };
    let ids = ids
        .map_err(|e| ApiError::invalid_param(param, format!("cannot tokenize the {param}: {e}")))?;
    Ok((ids, text))
}

/// A unique, unguessable response id such as `cmpl-3f0c…` (128 bits from std's random hasher keys).
pub(crate) fn request_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(count);
        h.finish()
    };
    format!("{prefix}-{:016x}{:016x}", word(), word())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_unique() {
        let ids: std::collections::HashSet<String> =
            (0..1000).map(|_| request_id("cmpl")).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids
            .iter()
            .all(|id| id.starts_with("cmpl-") && id.len() == 5 + 32));
    }
}
