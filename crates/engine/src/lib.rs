//! mlaserve-engine: the serving core between the HTTP server and the model.
//!
//! One engine thread owns the [`Model`](mlaserve_model::Model) and its paged latent cache and
//! loops `schedule → forward → sample`, fed by a channel of commands from any number of
//! [`EngineHandle`]s and answering on per-request [`RequestStream`]s.
//!
//! Modules, one concept each (nano-vllm's layout):
//! - [`block_manager`]: cache blocks, refcounts, prefix cache (chained block hashes, LRU);
//! - [`sequence`]: one request's tokens, progress, blocks and RNG;
//! - [`scheduler`]: continuous batching with a token budget, chunked prefill, prefix-cache
//!   skips and recompute preemption;
//! - [`sampler`]: penalties, temperature, min-p / top-k / top-p, seeded draws, logprobs;
//! - [`stop`]: stop strings across token boundaries;
//! - [`model_runner`]: schedule → `ForwardBatch` → logits rows;
//! - `engine` / `handle`: the loop and its thread-safe front ([`start_engine`]);
//! - [`bench`]: output-throughput measurement.

pub mod bench;
pub mod block_manager;
pub mod config;
mod engine;
pub mod error;
mod handle;
pub mod metrics;
pub mod model_runner;
pub mod request;
pub mod rng;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod sequence;
pub mod stop;

pub use config::{EngineConfig, ResolvedConfig};
pub use error::EngineError;
pub use handle::{collect_output, start_engine, start_engine_with, EngineHandle, GenerateOutput};
pub use metrics::EngineMetrics;
pub use request::{
    FinishReason, GenerateRequest, RequestEvent, RequestId, RequestStream, TokenLogprob, Usage,
};
pub use sampling_params::{SamplingParams, MAX_LOGPROBS};
