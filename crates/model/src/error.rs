//! Errors of model configuration, loading and the forward pass.

use std::path::PathBuf;

/// Everything that can go wrong between a model file and logits.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The metadata/config does not describe a model we can run.
    #[error("{source_name}: invalid model config: {msg}")]
    Config { source_name: String, msg: String },
    /// A tensor is missing, has the wrong shape or an unusable type.
    #[error("{source_name}: tensor `{tensor}`: {msg}")]
    Tensor {
        source_name: String,
        tensor: String,
        msg: String,
    },
    /// Reading the file failed.
    #[error("{path}: {msg}")]
    Io { path: PathBuf, msg: String },
    /// The GGUF container is malformed.
    #[error(transparent)]
    Gguf(#[from] mlaserve_gguf::GgufError),
    /// A batch violates the ForwardBatch invariants or the cache's capacity.
    #[error("invalid batch: {0}")]
    Batch(String),
    /// A collective between tensor-parallel ranks failed (names the rank and the collective).
    #[error(transparent)]
    Comm(#[from] crate::parallel::CommError),
    /// A tensor-parallel rank failed; `error` is that rank's own error.
    #[error("rank {rank}: {error}")]
    Rank { rank: usize, error: Box<ModelError> },
    /// A tensor-parallel rank panicked (or its thread is gone).
    #[error("rank {rank} panicked: {msg}")]
    RankPanicked { rank: usize, msg: String },
}
