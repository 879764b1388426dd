//! Helpers of the router tests: requests through `tower::ServiceExt::oneshot` (no socket), and
//! a real engine on a fixture GGUF model.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use std::time::{Duration, Instant};

use mlaserve_engine::{start_engine, EngineConfig, EngineHandle};
use mlaserve_model::{LoadOptions, Model};
use mlaserve_server::{app, AppState, ServerConfig};
use mlaserve_tokenizer::Tokenizer;
use serde_json::json;
use serde_json::Value;
use tower::ServiceExt;

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts an OpenAI-shaped error with this status; returns the error object.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text());
        let body = self.json();
        let err = body
            .get("error")
            .unwrap_or_else(|| panic!("no `error` in {body}"))
            .clone();
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{err}"
        );
        assert!(err["type"].is_string(), "{err}");
        assert!(
            err.get("param").is_some() && err.get("code").is_some(),
            "{err}"
        );
        err
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.text())
    }
}

pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            event
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

pub fn request(method: &str, uri: &str, body: Option<&str>) -> Request<Body> {
    let builder = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    builder
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .expect("valid request")
}

pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let response = app
        .clone()
        .oneshot(req)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body")
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn call(app: &Router, method: &str, uri: &str, body: Option<&str>) -> Reply {
    send(app, request(method, uri, body)).await
}

pub async fn post(app: &Router, uri: &str, body: &Value) -> Reply {
    call(app, "POST", uri, Some(&body.to_string())).await
}

pub fn fixture(name: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(name)
        .join(file)
}

/// A real engine on the tiny DeepSeek-V2 fixture (context 256, vocabulary 512).
pub fn fixture_engine(cfg: EngineConfig) -> EngineHandle {
    let path = fixture("deepseek_v2", "deepseek_v2-f32.gguf");
    let model = Model::load(&path, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let gguf = model.gguf().expect("a GGUF model has its file");
    let tokenizer = Arc::new(Tokenizer::from_gguf(gguf).expect("tokenizer from the fixture GGUF"));
    start_engine(model, tokenizer, cfg).expect("engine starts")
}

pub const MODEL: &str = "tiny-v2";

pub fn engine_config() -> EngineConfig {
    EngineConfig {
        num_blocks: Some(96),
        block_size: 16,
        ..EngineConfig::default()
    }
}

pub fn live_app_with(cfg: EngineConfig) -> (Router, EngineHandle) {
    let engine = fixture_engine(cfg);
    let config = ServerConfig {
        served_model_name: MODEL.into(),
        ..ServerConfig::default()
    };
    (app(AppState::with_engine(config, engine.clone())), engine)
}

pub fn live_app() -> (Router, EngineHandle) {
    live_app_with(engine_config())
}

/// Waits until the engine holds no request and no cache block (all freed).
pub async fn wait_until_idle(engine: &EngineHandle) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = engine.metrics();
        if m.num_running == 0 && m.num_waiting == 0 && m.num_cache_blocks_used == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "engine still busy: {m:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn greedy(prompt: Value, max_tokens: usize) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

/// The parsed chunks of an SSE body that must end with `[DONE]`.
pub fn stream_chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream must end with [DONE]: {data:?}"
    );
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect()
}
