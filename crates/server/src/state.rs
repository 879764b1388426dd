//! [`AppState`]: the configuration, the engine once it is ready, and the server's own metrics.
//!
//! The engine slot is a `OnceLock`: the server may start before the model has loaded (then
//! `/health` and the generation routes answer 503) and the engine is installed exactly once with
//! [`AppState::set_engine`]. Cloning an `AppState` is cheap and every clone sees the same slot.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use mlaserve_engine::EngineHandle;

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::metrics::ServerMetrics;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: ServerConfig,
    engine: OnceLock<EngineHandle>,
    metrics: ServerMetrics,
    /// Unix seconds at start, the `created` of `/v1/models`.
    started_at: u64,
}

impl AppState {
    /// A server whose engine is not loaded yet: `/health` answers 503 until [`Self::set_engine`].
    pub fn new(config: ServerConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                engine: OnceLock::new(),
                metrics: ServerMetrics::new(),
                started_at: unix_now(),
            }),
        }
    }

    /// A server that is ready at once.
    pub fn with_engine(config: ServerConfig, engine: EngineHandle) -> Self {
        let state = Self::new(config);
        let _ = state.inner.engine.set(engine);
        state
    }

    /// Install the engine; from now on the server is ready. Gives the handle back if one was
    /// already installed.
    pub fn set_engine(&self, engine: EngineHandle) -> Result<(), EngineHandle> {
        self.inner.engine.set(engine)
    }

    /// The engine, once installed.
    pub fn engine(&self) -> Option<&EngineHandle> {
        self.inner.engine.get()
    }

    /// Whether the engine is installed.
    pub fn is_ready(&self) -> bool {
        self.inner.engine.get().is_some()
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    pub(crate) fn metrics(&self) -> &ServerMetrics {
        &self.inner.metrics
    }

    pub(crate) fn started_at(&self) -> u64 {
        self.inner.started_at
    }

    /// The engine, or 503 while it is loading.
    pub(crate) fn ready_engine(&self) -> Result<&EngineHandle, ApiError> {
        self.engine().ok_or_else(|| {
            ApiError::unavailable("the model is still loading", self.config().retry_after_secs)
        })
    }

    /// The context window requests are checked against: the engine's, capped by the config.
    pub fn max_model_len(&self) -> Option<usize> {
        let engine = self.engine().map(EngineHandle::max_model_len);
        match (engine, self.config().max_model_len) {
            (Some(e), Some(c)) => Some(e.min(c)),
            (e, c) => e.or(c),
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
