//! mlaserve-cuda: the CUDA executor.
//!
//! One binary serves CPU-only and GPU hosts: cudarc loads libcuda, NVRTC and cuBLAS at run
//! time (`dynamic-loading`), and [`gpu::check_libraries`] turns a missing library into an
//! error before any call that would panic. Kernels (`kernels/*.cu`) are compiled by NVRTC
//! for the device at start and cached on disk ([`kernels`]). Weights live on the GPU in
//! bf16 (GGUF blocks dequantized at load), activations are rounded to bf16 at each GEMM
//! input with f32 accumulation, norms/softmax/the residual stream stay f32, and the latent
//! cache is bf16. [`CudaExecutor`] is checked against the CPU executor op by op
//! (`tests/ops/`) and end to end (`tests/e2e.rs`).

pub mod error;
pub mod executor;
pub mod flash_attn;
pub mod gemv;
pub mod gpu;
mod graphs;
pub mod kernels;
pub mod mla_cluster;
pub mod mla_decode;
pub mod moe_grouped;
pub mod nccl;
pub mod ops;
pub mod qgemv;
pub mod qmmq;
mod step_inputs;
pub mod tp;
pub mod weights;

pub use error::CudaError;
pub use executor::CudaExecutor;
pub use gpu::{check_libraries, DBuf, Gpu};
pub use tp::CudaTpExecutor;
