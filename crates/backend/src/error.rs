//! Errors of the backend crate. Every variant names the offending values.

use mlaserve_gguf::GgmlType;

/// An error from building or using a backend object.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The type has no kernel in this backend (e.g. the IQ1/IQ2/IQ3 grid types).
    #[error("ggml type {0} is not supported by the CPU matmul")]
    UnsupportedType(GgmlType),
    /// `cols` is not a whole number of blocks of the type.
    #[error(
        "{ty} matrix with {cols} columns: columns must be a multiple of the block size {block}"
    )]
    ColsNotBlockMultiple {
        /// The weight type.
        ty: GgmlType,
        /// The number of columns given.
        cols: usize,
        /// The type's block size.
        block: usize,
    },
    /// The data length does not match `rows * row_bytes`.
    #[error("{ty} matrix [{rows} x {cols}] needs {expected} bytes, got {got}")]
    SizeMismatch {
        /// The weight type.
        ty: GgmlType,
        /// Rows (out_features).
        rows: usize,
        /// Columns (in_features).
        cols: usize,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes supplied.
        got: usize,
    },
    /// `rows * cols` or the byte count overflows `usize`.
    #[error("matrix shape [{rows} x {cols}] overflows usize")]
    ShapeOverflow {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// A type cannot be produced by `QMatrix::quantize_from_f32`.
    #[error("cannot quantize to {ty}: {reason}")]
    Quantize {
        /// The target type.
        ty: GgmlType,
        /// Why not.
        reason: String,
    },
}
