//! mlaserve's OpenAI-compatible HTTP server.
//!
//! Routes: `GET /health` (503 until the engine is ready), `GET /v1/models`,
//! `POST /v1/completions`, `POST /v1/chat/completions` (both with SSE streaming),
//! `GET /metrics` (Prometheus text), `GET /version`.
//!
//! Design: a thin layer over [`mlaserve_engine::EngineHandle`]. Handlers validate (every bad
//! input is a 4xx in OpenAI's error shape, never a panic), tokenize, submit one engine request per
//! choice and turn the per-request events into JSON or SSE chunks. Engine requests are owned by
//! the handler future or the SSE body, so a client that goes away aborts them and frees their
//! cache blocks with no extra bookkeeping. [`app`] builds the router without a socket (tests call
//! it with `tower::ServiceExt::oneshot`); [`serve`] binds it and shuts down gracefully on
//! SIGINT/SIGTERM: stop accepting, let in-flight requests finish, then drain the engine.

mod config;
mod error;
mod extract;
mod generate;
mod logprobs;
mod metrics;
mod params;
pub mod protocol;
mod routes;
mod sse;
mod state;

use std::future::Future;

use anyhow::Context as _;
use axum::routing::{get, post};
use axum::Router;
use mlaserve_engine::EngineHandle;
use tokio::net::TcpListener;

pub use config::ServerConfig;
pub use error::ApiError;
pub use extract::JsonBody;
pub use state::AppState;

/// The router with every route, the API-key gate and the response counter.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/health", get(routes::health))
        .route("/version", get(routes::version))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::models))
        .route("/v1/completions", post(routes::completions::completions))
        .route("/v1/chat/completions", post(routes::chat::chat_completions))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::gate_and_count,
        ))
        .with_state(state)
}

/// Serve `handle` on `cfg.host:cfg.port` until SIGINT or SIGTERM, then drain: in-flight
/// requests finish, the engine finishes its running requests and stops.
pub async fn serve(handle: EngineHandle, cfg: ServerConfig) -> anyhow::Result<()> {
    let state = AppState::with_engine(cfg, handle.clone());
    let result = serve_state(state, shutdown_signal()).await;
    handle.shutdown();
    let engine = handle.clone();
    if tokio::task::spawn_blocking(move || engine.wait())
        .await
        .is_err()
    {
        tracing::error!("joining the engine thread failed");
    }
    result
}

/// Bind `state.config()`'s address and serve until `shutdown` resolves. For a CLI that starts
/// the server before the model has loaded: build an [`AppState::new`], call this, and
/// [`AppState::set_engine`] when loading is done.
pub async fn serve_state(
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = (state.config().host.clone(), state.config().port);
    let listener = TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {}:{}", addr.0, addr.1))?;
    serve_listener(listener, state, shutdown).await
}

/// Serve on an already bound listener until `shutdown` resolves, then wait for in-flight
/// requests (streams included) to finish.
pub async fn serve_listener(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let local = listener
        .local_addr()
        .context("listener has no local address")?;
    tracing::info!(%local, model = %state.config().served_model_name, "serving the OpenAI API");
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
        .context("HTTP server failed")?;
    tracing::info!("HTTP server stopped; in-flight requests finished");
    Ok(())
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT: shutting down gracefully"),
        () = terminate => tracing::info!("SIGTERM: shutting down gracefully"),
    }
}
