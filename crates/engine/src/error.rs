//! Errors of `mlaserve-engine`'s public API.

/// Why a request (or the engine itself) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The waiting queue holds `max_waiting` requests already; retry later.
    #[error("the engine's waiting queue is full")]
    QueueFull,
    /// A request (or, from `start_engine`, the engine configuration) is invalid; the message
    /// names the offending field.
    #[error("{0}")]
    InvalidRequest(String),
    /// The prompt leaves no room for output in the context window of `max` tokens.
    #[error("prompt has {prompt} tokens but the context holds {max}, leaving no room for output")]
    PromptTooLong { prompt: usize, max: usize },
    /// The engine is shutting down or has exited.
    #[error("the engine has shut down")]
    Shutdown,
    /// The model failed (loading the cache, or a forward pass).
    #[error("model error: {0}")]
    Model(String),
}
