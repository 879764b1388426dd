//! mlaserve-model: the forward pass of MLA models (DeepSeek-V2/V3, GLM-5) on CPU.
//!
//! [`Model::load`] reads a GGUF file or an HF safetensors directory into a validated
//! [`ModelConfig`] and [`weights::Weights`]; [`Model::forward`] runs one [`ForwardBatch`]
//! against a paged [`LatentCache`] and returns logits. The CPU path is the reference every
//! other backend is checked against. [`parallel`] splits a model over tensor-parallel ranks.

pub mod config;
pub mod doctor;
pub mod draw;
pub mod dump;
pub mod error;
pub mod executor;
pub mod forward_batch;
pub mod kv_cache;
pub mod layers;
pub mod model;
pub mod parallel;
pub mod probe;
pub mod score;
pub mod source;
pub mod weights;

pub use config::{Arch, Gating, IndexerConfig, ModelConfig, MoeConfig, Yarn};
pub use draw::{Filter, RowDraw, RowPick};
pub use error::ModelError;
pub use executor::{CpuExecutor, Executor, RowArgmax};
pub use forward_batch::{AttentionPath, ForwardBatch, LogitsWanted, SeqInput};
pub use kv_cache::LatentCache;
pub use mlaserve_gguf as gguf;
pub use model::{LoadOptions, Model};
pub use parallel::{Shard, TpExecutor, TpOptions};
