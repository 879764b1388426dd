//! Errors of the CUDA executor: each names what failed (driver call, kernel, GEMM, load).

use mlaserve_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable driver or library on this host (checked before any CUDA call).
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("CUDA driver: {context}: {msg}")]
    Driver { context: String, msg: String },
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile { arch: String, log: String },
    #[error("cuBLAS {op}: {msg}")]
    Cublas { op: String, msg: String },
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    Invalid(String),
}

impl CudaError {
    pub fn driver(context: impl Into<String>, e: impl std::fmt::Debug) -> Self {
        CudaError::Driver {
            context: context.into(),
            msg: format!("{e:?}"),
        }
    }
}

impl From<CudaError> for ModelError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Model(m) => m,
            other => ModelError::Batch(format!("cuda: {other}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, CudaError>;
