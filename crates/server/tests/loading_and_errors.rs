//! Router tests that need no model: the server before the engine is installed (`/health` 503,
//! generation 503) and every client error that is caught before the engine is asked.

mod common;

use axum::Router;
use common::{call, post};
use mlaserve_server::{app, AppState, ServerConfig};
use serde_json::{json, Value};

fn loading_app(cfg: ServerConfig) -> Router {
    app(AppState::new(cfg))
}

fn default_app() -> Router {
    loading_app(ServerConfig {
        served_model_name: "tiny".into(),
        ..ServerConfig::default()
    })
}

#[tokio::test]
async fn health_is_503_until_the_engine_is_installed() {
    let app = default_app();
    let reply = call(&app, "GET", "/health", None).await;
    let err = reply.error(503);
    assert!(err["message"].as_str().unwrap().contains("loading"));
    assert_eq!(reply.headers["retry-after"], "1");
}

#[tokio::test]
async fn generation_is_503_while_loading_but_validation_comes_first() {
    let app = default_app();
    let ok_body = json!({"model": "tiny", "prompt": "hello", "max_tokens": 4});
    post(&app, "/v1/completions", &ok_body).await.error(503);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    post(&app, "/v1/chat/completions", &chat).await.error(503);
    // A bad request is a 400 whether or not the model is loaded.
    post(
        &app,
        "/v1/completions",
        &json!({"prompt": "hello", "temperature": -1}),
    )
    .await
    .error(400);
}

#[tokio::test]
async fn models_lists_the_served_name() {
    let app = loading_app(ServerConfig {
        served_model_name: "tiny".into(),
        max_model_len: Some(128),
        ..ServerConfig::default()
    });
    let reply = call(&app, "GET", "/v1/models", None).await;
    assert_eq!(reply.status, 200);
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"].as_array().unwrap().len(), 1);
    assert_eq!(body["data"][0]["id"], "tiny");
    assert_eq!(body["data"][0]["object"], "model");
    assert_eq!(body["data"][0]["max_model_len"], 128);
}

#[tokio::test]
async fn malformed_json_is_400_in_openai_shape() {
    let app = default_app();
    for (uri, body) in [
        ("/v1/completions", "{\"prompt\": \"x\""),
        ("/v1/completions", ""),
        ("/v1/completions", "[1, 2]"),
        (
            "/v1/completions",
            "{\"prompt\": \"x\", \"max_tokens\": \"five\"}",
        ),
        ("/v1/completions", "{\"prompt\": \"x\", \"n\": 1.5}"),
        ("/v1/chat/completions", "not json"),
        ("/v1/chat/completions", "{\"messages\": \"hi\"}"),
        (
            "/v1/chat/completions",
            "{\"messages\": [{\"content\": \"no role\"}]}",
        ),
    ] {
        let err = call(&app, "POST", uri, Some(body)).await.error(400);
        assert_eq!(err["type"], "invalid_request_error", "{body}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("invalid JSON body"),
            "{body}: {err}"
        );
    }
}

#[tokio::test]
async fn unknown_model_is_404() {
    let app = default_app();
    let err = post(
        &app,
        "/v1/completions",
        &json!({"model": "gpt-4", "prompt": "x"}),
    )
    .await
    .error(404);
    assert_eq!(err["param"], "model");
    assert_eq!(err["code"], "model_not_found");
    assert!(err["message"].as_str().unwrap().contains("gpt-4"));
    let chat = json!({"model": "other", "messages": [{"role": "user", "content": "x"}]});
    post(&app, "/v1/chat/completions", &chat).await.error(404);
}

#[tokio::test]
async fn out_of_range_parameters_are_400_naming_the_parameter() {
    let app = default_app();
    let completion_cases: Vec<(Value, &str)> = vec![
        (json!({"prompt": "x", "temperature": -0.5}), "temperature"),
        (json!({"prompt": "x", "top_p": 0}), "top_p"),
        (json!({"prompt": "x", "top_p": 1.01}), "top_p"),
        (json!({"prompt": "x", "top_k": -7}), "top_k"),
        (json!({"prompt": "x", "min_p": -0.1}), "min_p"),
        (json!({"prompt": "x", "n": 0}), "n"),
        (json!({"prompt": "x", "n": -3}), "n"),
        (json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": "x", "max_tokens": -1}), "max_tokens"),
        (json!({"prompt": "x", "logprobs": 21}), "logprobs"),
        (json!({"prompt": "x", "logprobs": -1}), "logprobs"),
        (
            json!({"prompt": "x", "presence_penalty": 3}),
            "presence_penalty",
        ),
        (
            json!({"prompt": "x", "frequency_penalty": -2.5}),
            "frequency_penalty",
        ),
        (
            json!({"prompt": "x", "repetition_penalty": 0}),
            "repetition_penalty",
        ),
        (json!({"prompt": "x", "stop": 7}), "stop"),
        (json!({"prompt": "x", "stop": ["ok", 1]}), "stop"),
        (json!({"prompt": "x", "echo": true, "logprobs": 2}), "echo"),
        (json!({"prompt": "x", "suffix": "tail"}), "suffix"),
        (
            json!({"prompt": "x", "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [[]]}), "prompt"),
        (json!({"prompt": [1, -1]}), "prompt"),
        (json!({"prompt": {"text": "x"}}), "prompt"),
        (json!({}), "prompt"),
    ];
    for (body, param) in completion_cases {
        let err = post(&app, "/v1/completions", &body).await.error(400);
        assert_eq!(err["param"], param, "{body}: {err}");
    }
    let user = json!([{"role": "user", "content": "x"}]);
    let chat_cases: Vec<(Value, &str)> = vec![
        (json!({"messages": []}), "messages"),
        (json!({}), "messages"),
        (json!({"messages": user, "top_logprobs": 3}), "top_logprobs"),
        (
            json!({"messages": user, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": user, "max_completion_tokens": 0}),
            "max_completion_tokens",
        ),
        (json!({"messages": user, "max_tokens": 0}), "max_tokens"),
        (json!({"messages": user, "temperature": -1}), "temperature"),
        (
            json!({"messages": user, "tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            json!({"messages": user, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": 3}]}),
            "messages[0].content",
        ),
    ];
    for (body, param) in chat_cases {
        let err = post(&app, "/v1/chat/completions", &body).await.error(400);
        assert_eq!(err["param"], param, "{body}: {err}");
    }
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let app = default_app();
    // Passes validation (then 503: no engine), so the unknown fields did not make it a 400.
    let body = json!({"prompt": "x", "frobnicate": true, "user": "me", "extra": {"deep": [1]}});
    post(&app, "/v1/completions", &body).await.error(503);
}

#[tokio::test]
async fn unknown_routes_and_methods_are_openai_errors() {
    let app = default_app();
    let err = call(&app, "GET", "/v1/nothing", None).await.error(404);
    assert!(err["message"].as_str().unwrap().contains("/v1/nothing"));
    call(&app, "GET", "/v1/completions", None).await.error(405);
    call(&app, "DELETE", "/v1/chat/completions", None)
        .await
        .error(405);
}

#[tokio::test]
async fn oversized_body_is_413() {
    let app = loading_app(ServerConfig {
        max_body_bytes: 1000,
        ..ServerConfig::default()
    });
    let body = json!({"prompt": "x".repeat(2000)});
    post(&app, "/v1/completions", &body).await.error(413);
}

#[tokio::test]
async fn api_key_guards_v1_only() {
    let app = loading_app(ServerConfig {
        api_key: Some("sekret".into()),
        ..ServerConfig::default()
    });
    let err = call(&app, "GET", "/v1/models", None).await.error(401);
    assert_eq!(err["code"], "invalid_api_key");
    let mut req = common::request("GET", "/v1/models", None);
    req.headers_mut()
        .insert("authorization", "Bearer sekret".parse().unwrap());
    assert_eq!(common::send(&app, req).await.status, 200);
    let mut req = common::request("GET", "/v1/models", None);
    req.headers_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    common::send(&app, req).await.error(401);
    // Health and metrics stay open for probes and scrapers.
    assert_eq!(call(&app, "GET", "/metrics", None).await.status, 200);
}

#[tokio::test]
async fn metrics_count_responses_by_route_and_status() {
    let app = default_app();
    post(&app, "/v1/completions", &json!({"prompt": "x", "n": 0}))
        .await
        .error(400);
    post(&app, "/v1/completions", &json!({"prompt": "x", "top_p": 2}))
        .await
        .error(400);
    call(&app, "GET", "/nowhere", None).await.error(404);
    let reply = call(&app, "GET", "/metrics", None).await;
    assert_eq!(reply.status, 200);
    assert!(reply.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = reply.text();
    assert!(
        text.contains("mlaserve:http_requests_total{model_name=\"tiny\",route=\"/v1/completions\",status=\"400\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("route=\"unmatched\",status=\"404\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mlaserve:engine_ready{model_name=\"tiny\"} 0"),
        "{text}"
    );
}
