//! [`QMatrix`]: a weight matrix kept in its stored ggml type.
//!
//! Invariants (established by the constructors, re-checked by `matmul` because the shape
//! fields are public): the type is supported by this crate, `cols` is a multiple of the type's
//! block size, and `data.len() == rows * row_bytes()`. Row `r` occupies bytes
//! `r * row_bytes() .. (r + 1) * row_bytes()`.

use crate::bytes::Bytes;
use crate::dequant::{dequantize_row_unchecked, is_supported};
use crate::error::BackendError;
use mlaserve_gguf::GgmlType;

/// A weight matrix W [rows = out_features, cols = in_features] stored row-major in a ggml
/// type; each row is `cols / block_size` blocks. Quantized stays quantized.
#[derive(Clone, Debug)]
pub struct QMatrix {
    /// Storage type of the elements.
    pub ty: GgmlType,
    /// Number of rows (out_features).
    pub rows: usize,
    /// Number of columns (in_features).
    pub cols: usize,
    data: Bytes,
    /// Multiply f32 activations by the dequantized weights (exact), not the activations
    /// converted to the type's vec_dot type (see [`QMatrix::with_f32_activations`]).
    f32_act: bool,
}

impl QMatrix {
    /// Wrap `data` as a `[rows, cols]` matrix of type `ty`, checking type support and size.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: Bytes) -> Result<Self, BackendError> {
        let expected = Self::check_shape(ty, rows, cols)?;
        if data.len() != expected {
            return Err(BackendError::SizeMismatch {
                ty,
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            data,
            f32_act: false,
        })
    }

    /// This matrix multiplied as its exact dequantized values against f32 activations:
    /// `matmul` then converts no activation; for up to 4 tokens Q8_0/Q4_0/Q5_0/Q4_K rows are
    /// dequantized in registers (F16/BF16 rows widened) on SIMD levels, otherwise each tile's
    /// weights are dequantized to f32 once a chunk for its tokens. The bytes read stay the stored ones (a quarter of f32's for Q8_0);
    /// the results are those of the f32 matrix of [`QMatrix::to_f32`] up to the order of f32
    /// additions. For products whose inputs must not be rounded: the absorbed attention's
    /// `W_UK`/`W_UV`, which the unabsorbed path checks against (llama.cpp rounds them to
    /// Q8_0).
    pub fn with_f32_activations(mut self) -> Self {
        self.f32_act = true;
        self
    }

    /// Whether [`QMatrix::with_f32_activations`] applies.
    pub fn has_f32_activations(&self) -> bool {
        self.f32_act
    }

    /// Bytes a `[rows, cols]` matrix of `ty` takes, or why it cannot exist.
    fn check_shape(ty: GgmlType, rows: usize, cols: usize) -> Result<usize, BackendError> {
        if !is_supported(ty) {
            return Err(BackendError::UnsupportedType(ty));
        }
        let block = ty.block_size();
        if !cols.is_multiple_of(block) {
            return Err(BackendError::ColsNotBlockMultiple { ty, cols, block });
        }
        (cols / block)
            .checked_mul(ty.type_size())
            .and_then(|rb| rb.checked_mul(rows))
            .ok_or(BackendError::ShapeOverflow { rows, cols })
    }

    /// An F32 matrix owning `v` (`[rows * cols]`, row-major).
    ///
    /// # Panics
    /// If `v.len() != rows * cols`.
    pub fn from_f32(rows: usize, cols: usize, v: Vec<f32>) -> Self {
        assert_eq!(
            v.len(),
            rows * cols,
            "QMatrix::from_f32: {} values for [{rows} x {cols}]",
            v.len()
        );
        let bytes: Vec<u8> = bytemuck::cast_slice(&v).to_vec();
        Self {
            ty: GgmlType::F32,
            rows,
            cols,
            data: Bytes::from_vec(bytes),
            f32_act: false,
        }
    }

    /// Quantize row-major f32 values `[rows * cols]` to `ty` (ggml's reference quantizers,
    /// through `mlaserve_gguf::quants`; F32/F16/BF16 are converted here).
    pub fn quantize_from_f32(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        v: &[f32],
    ) -> Result<Self, BackendError> {
        let expected = Self::check_shape(ty, rows, cols)?;
        if v.len() != rows * cols {
            return Err(BackendError::Quantize {
                ty,
                reason: format!("{} values given for a [{rows} x {cols}] matrix", v.len()),
            });
        }
        let data = crate::quantize::quantize_rows(ty, cols, v)?;
        debug_assert_eq!(data.len(), expected);
        Self::new(ty, rows, cols, Bytes::from_vec(data))
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The stored bytes (`rows * row_bytes()`).
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// The bytes of row `r`.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row(&self, r: usize) -> &[u8] {
        assert!(r < self.rows, "row {r} of a {}-row matrix", self.rows);
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Rows `start..start + n` as a matrix sharing this one's bytes (an expert of a stacked
    /// `[E, F, H]` tensor, or a tensor-parallel shard of the output dimension).
    ///
    /// # Panics
    /// If the range is not inside `0..rows`.
    pub fn rows_slice(&self, start: usize, n: usize) -> QMatrix {
        assert!(
            start.checked_add(n).is_some_and(|end| end <= self.rows),
            "rows_slice({start}, {n}) of a {}-row matrix",
            self.rows
        );
        let rb = self.row_bytes();
        Self {
            ty: self.ty,
            rows: n,
            cols: self.cols,
            data: self.data.slice(start * rb..(start + n) * rb),
            f32_act: self.f32_act,
        }
    }

    /// Dequantize row `r` into `out` (`cols` values).
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(
            out.len(),
            self.cols,
            "dequantize_row: output length vs cols"
        );
        dequantize_row_unchecked(self.ty, self.row(r), out);
    }

    /// All values as f32, row-major `[rows * cols]`.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
                self.dequantize_row(r, o);
            }
        }
        out
    }

    /// Panic with a message if the public shape fields were changed into an inconsistent
    /// state: the kernels rely on these invariants for their unchecked reads.
    pub(crate) fn assert_consistent(&self) {
        let ok =
            Self::check_shape(self.ty, self.rows, self.cols).is_ok_and(|b| b == self.data.len());
        assert!(
            ok,
            "QMatrix {} [{} x {}] inconsistent with its {} bytes",
            self.ty,
            self.rows,
            self.cols,
            self.data.len()
        );
    }
}
