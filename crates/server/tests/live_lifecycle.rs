//! Router tests of a request's lifecycle on a real engine (tiny DeepSeek-V2 fixture): queue-full,
//! client disconnects (streaming and not) that free the cache, readiness, metrics, and graceful
//! shutdown over a real socket.

mod common;

use std::time::{Duration, Instant};

use common::{
    call, engine_config, fixture_engine, greedy, live_app, live_app_with, post, request,
    wait_until_idle, MODEL,
};
use futures_util::StreamExt;
use mlaserve_engine::EngineConfig;
use mlaserve_server::{app, serve_listener, AppState, ServerConfig};
use serde_json::json;
use tower::ServiceExt;

#[tokio::test]
async fn queue_full_is_429_and_the_server_recovers() {
    let (app, engine) = live_app_with(EngineConfig {
        max_num_seqs: 1,
        max_waiting: 1,
        ..engine_config()
    });
    // Three choices, one running slot, one queue slot: the third add is refused.
    let mut body = greedy(json!("Hello"), 200);
    body["n"] = json!(3);
    let reply = post(&app, "/v1/completions", &body).await;
    let err = reply.error(429);
    assert_eq!(err["type"], "rate_limit_error");
    assert_eq!(reply.headers["retry-after"], "1");
    // The server serves again once the refused request's accepted siblings (one or two,
    // depending on how fast the engine admitted the first) are aborted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let ok = loop {
        let reply = post(&app, "/v1/completions", &greedy(json!("Hello"), 3)).await;
        if reply.status != 429 || Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ok.status, 200, "{}", ok.text());
    wait_until_idle(&engine).await;
    let m = engine.metrics();
    assert_eq!(
        m.num_finished_length, 1,
        "only the last request may finish: {m:?}"
    );
    assert!((1..=2).contains(&m.num_aborted), "{m:?}");
    assert!(
        m.generation_tokens_total < 200,
        "an aborted sibling kept generating: {m:?}"
    );
}

#[tokio::test]
async fn dropped_stream_aborts_and_frees_blocks() {
    let (app, engine) = live_app();
    let mut body = greedy(json!("Hello"), 220);
    body["stream"] = json!(true);
    let response = app
        .clone()
        .oneshot(request("POST", "/v1/completions", Some(&body.to_string())))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut frames = response.into_body().into_data_stream();
    for _ in 0..3 {
        frames.next().await.expect("a chunk").expect("chunk bytes");
    }
    assert!(
        engine.metrics().num_cache_blocks_used > 0,
        "the request holds blocks while streaming"
    );
    drop(frames);
    wait_until_idle(&engine).await;
    let text = call(&app, "GET", "/metrics", None).await.text();
    assert!(
        text.contains(&format!(
            "mlaserve:request_success_total{{model_name=\"{MODEL}\",finished_reason=\"abort\"}} 1"
        )),
        "{text}"
    );
}

#[tokio::test]
async fn dropped_non_streaming_request_aborts() {
    let (app, engine) = live_app();
    let body = greedy(json!("Hello"), 230);
    let pending = tokio::spawn(app.clone().oneshot(request(
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
    )));
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.metrics().num_cache_blocks_used == 0 {
        assert!(
            !pending.is_finished(),
            "finished before it was seen running"
        );
        assert!(Instant::now() < deadline, "the request never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Drop the handler future mid-generation, as hyper does when the client goes away.
    pending.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.metrics().num_aborted == 0 {
        assert!(
            Instant::now() < deadline,
            "not aborted: {:?}",
            engine.metrics()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_until_idle(&engine).await;
    assert_eq!(
        engine.metrics().num_finished_length,
        0,
        "it ran to completion"
    );
}

#[tokio::test]
async fn health_flips_when_the_engine_arrives_and_metrics_show_it() {
    let state = AppState::new(ServerConfig {
        served_model_name: MODEL.into(),
        ..ServerConfig::default()
    });
    let app = app(state.clone());
    call(&app, "GET", "/health", None).await.error(503);
    let engine = fixture_engine(engine_config());
    state.set_engine(engine.clone()).unwrap();
    assert_eq!(call(&app, "GET", "/health", None).await.status, 200);
    let models = call(&app, "GET", "/v1/models", None).await.json();
    assert_eq!(models["data"][0]["max_model_len"], engine.max_model_len());

    let ok = post(&app, "/v1/completions", &greedy(json!("Hello"), 5)).await;
    assert_eq!(ok.status, 200);
    // The engine publishes its snapshot after the step that finished the request.
    wait_until_idle(&engine).await;
    let text = call(&app, "GET", "/metrics", None).await.text();
    let m = format!("model_name=\"{MODEL}\"");
    for needle in [
        format!("mlaserve:engine_ready{{{m}}} 1"),
        format!("mlaserve:request_success_total{{{m},finished_reason=\"length\"}} 1"),
        format!("mlaserve:time_to_first_token_seconds_count{{{m}}} 1"),
        format!("mlaserve:time_per_output_token_seconds_count{{{m}}} 1"),
        format!("mlaserve:e2e_request_latency_seconds_count{{{m}}} 1"),
        format!("mlaserve:request_generation_tokens_total{{{m}}} 5"),
        format!("mlaserve:num_requests_running{{{m}}} 0"),
        format!("mlaserve:cache_blocks_total{{{m}}} 96"),
        format!("mlaserve:kv_cache_usage_perc{{{m}}}"),
        format!("mlaserve:prefix_cache_queries_total{{{m}}}"),
        format!("mlaserve:prefix_cache_hits_total{{{m}}}"),
        format!("mlaserve:generation_tokens_total{{{m}}} 5"),
    ] {
        assert!(text.contains(&needle), "missing `{needle}` in\n{text}");
    }
}

/// Over a real socket: a stream in flight when shutdown starts still completes, and the
/// server then returns.
#[tokio::test]
async fn graceful_shutdown_drains_in_flight_streams() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let engine = fixture_engine(engine_config());
    let state = AppState::with_engine(ServerConfig::default(), engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_listener(listener, state, async move {
        let _ = stop_rx.await;
    }));

    let body = json!({"prompt": "Hello", "max_tokens": 150, "temperature": 0, "ignore_eos": true, "stream": true})
        .to_string();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body.as_bytes()).await.unwrap();
    let mut first = [0u8; 256];
    let n = socket.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    stop_tx.send(()).unwrap();

    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let all = String::from_utf8_lossy(&first[..n]).into_owned() + &String::from_utf8_lossy(&rest);
    assert!(
        all.contains("data: [DONE]"),
        "stream cut by shutdown: {all}"
    );
    assert!(all.contains("\"finish_reason\":\"length\""));
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server returns")
        .unwrap()
        .unwrap();
    // New connections are refused once it has returned.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn server_max_model_len_caps_the_engine_window() {
    let engine = fixture_engine(engine_config());
    let config = ServerConfig {
        served_model_name: MODEL.into(),
        max_model_len: Some(40),
        ..ServerConfig::default()
    };
    let app = app(AppState::with_engine(config, engine.clone()));
    assert!(engine.max_model_len() > 40);
    let err = post(&app, "/v1/completions", &greedy(json!("Hello"), 60))
        .await
        .error(400);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 40 tokens"),
        "{err}"
    );
    let models = call(&app, "GET", "/v1/models", None).await.json();
    assert_eq!(models["data"][0]["max_model_len"], 40);
    let ok = post(&app, "/v1/completions", &greedy(json!("Hello"), 30)).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
}
