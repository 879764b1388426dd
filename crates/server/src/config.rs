//! [`ServerConfig`]: what the HTTP layer needs to know beyond the engine.

/// Settings of the HTTP server. `Default` listens on 127.0.0.1:8000 as `mlaserve`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind, e.g. `127.0.0.1` or `0.0.0.0`.
    pub host: String,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// The only name accepted in a request's `model` field (a missing `model` is accepted too).
    pub served_model_name: String,
    /// Caps the context window below the engine's `max_model_len`; `None` keeps the engine's.
    pub max_model_len: Option<usize>,
    /// When set, `/v1/*` requires `Authorization: Bearer <api_key>`.
    pub api_key: Option<String>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Largest accepted `n` (each choice is one engine request).
    pub max_n: usize,
    /// Largest accepted `logprobs` / `top_logprobs` (vLLM's default is 20).
    pub max_logprobs: usize,
    /// `Retry-After` seconds sent with 429 and 503.
    pub retry_after_secs: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: 8000,
            served_model_name: "mlaserve".to_owned(),
            max_model_len: None,
            api_key: None,
            max_body_bytes: 16 << 20,
            max_n: 128,
            max_logprobs: 20,
            retry_after_secs: 1,
        }
    }
}
