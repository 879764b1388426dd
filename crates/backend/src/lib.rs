//! CPU compute kernels for mlaserve.
//!
//! The centre is [`matmul`]: `out[t, r] = Σ_c x[t, c] · W[r, c]` with `W` a [`QMatrix`] kept in
//! its stored ggml type. It follows llama.cpp's CPU semantics: each activation row is first
//! converted to the weight type's *vec_dot type* ([`ActType::for_weight`]: Q8_0, Q8_1, Q8_K,
//! F16, BF16 or F32), then every output is the block-wise integer (or float) dot product times
//! the block scales. Kernels exist in portable scalar form for every supported type, in
//! AVX2+FMA form for every supported type but Q8_K, and in AVX-512BW form for Q4_K/Q5_K/Q8_0/Q5_0; the
//! level is chosen once at run time ([`Isa::detect`]). Types this crate cannot decode (the
//! IQ1/IQ2/IQ3 grids, TQ*, Q8_1 as a weight) are rejected by [`QMatrix::new`] with
//! [`BackendError::UnsupportedType`].
//!
//! Guarantees the model and engine can build on:
//! - a token's output does not depend on the other tokens in the call (bit-identical batched
//!   and one-at-a-time results; see `matmul.rs`);
//! - the scalar level is the reference: every SIMD level computes the same integer block
//!   sums and differs only by the order of f32 additions (tested); the AVX-512 Q4_K/Q5_K/Q8_0/Q5_0
//!   kernels equal it bit for bit.
//!
//! [`team::run`] keeps rayon's workers spinning for a forward pass's products instead of
//! sleeping between them (same results, fewer wake-ups).
//!
//! Around it: [`Bytes`] (zero-copy weight storage over a memory map or a `Vec`) and the small
//! f32 helpers a transformer layer needs ([`rms_norm`], [`softmax_inplace`], [`silu_mul`],
//! [`dot_f32`], [`axpy`]).
#![deny(missing_docs)]

mod act;
mod bytes;
mod dequant;
mod error;
mod isa;
pub mod kernels;
mod matmul;
mod ops;
mod qmatrix;
mod quantize;
pub mod team;

pub use act::{dequantize_act_row, quantize_act_row, quantize_act_row_with, ActType};
pub use bytes::Bytes;
pub use dequant::dequantize_row_bytes;
pub use error::BackendError;
pub use isa::Isa;
pub use matmul::{matmul, matmul_batch, matmul_batch_with, matmul_with, MatmulJob};
pub use mlaserve_gguf::GgmlType;
pub use ops::{axpy, axpy_rows, dot_f32, rms_norm, silu_mul, softmax_inplace};
pub use qmatrix::QMatrix;
