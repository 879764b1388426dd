//! Tensor descriptors of a GGUF file.
//!
//! Invariants of every [`TensorInfo`] this crate hands out: at most [`MAX_DIMS`] dims, every
//! dim in `1..=i64::MAX`, the element count fits in `i64` and `usize`, `dims[0]` (the row,
//! ggml's innermost `ne[0]`) is a whole number of blocks of `ggml_type`, and
//! `n_bytes = n_elements / block_size * type_size` without overflow. For tensors read from
//! a file, additionally `offset` is a multiple of the file's alignment, the bytes lie inside
//! the file, and no two tensors share bytes.

use crate::error::Problem;
use crate::ggml_type::GgmlType;

/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;

/// One tensor's name, shape, type and place in the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The GGUF tensor name, e.g. "blk.0.attn_kv_a_mqa.weight".
    pub name: String,
    /// Dims in ggml order: `dims[0]` = `ne[0]` is the innermost (contiguous) one.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes the tensor's data takes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Validates `dims` for `ggml_type` and computes the byte size.
    ///
    /// Errors: more than 4 dims, a dim of 0 or above `i64::MAX`, an element count or byte
    /// size that overflows, or a row (`dims[0]`) that is not a whole number of blocks.
    /// An empty `dims` is a scalar (one element), as in ggml.
    pub fn new(
        name: impl Into<String>,
        dims: Vec<u64>,
        ggml_type: GgmlType,
        offset: u64,
    ) -> Result<Self, Problem> {
        let n_bytes = byte_size(&dims, ggml_type)?;
        Ok(TensorInfo {
            name: name.into(),
            dims,
            ggml_type,
            offset,
            n_bytes,
        })
    }

    /// Shape in torch order (dims reversed): `[.., ne[1], ne[0]]`.
    pub fn shape(&self) -> Vec<usize> {
        // Dims fit in usize: their product does (checked in `byte_size`).
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of dims.
    pub fn n_dims(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements (product of dims; 1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row length in elements (`ne[0]`; 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (`n_elements / ne[0]`).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.row_len() / self.ggml_type.block_size() as u64 * self.ggml_type.type_size() as u64
    }

    /// Range of the tensor's bytes relative to the data section.
    pub fn byte_range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.n_bytes
    }
}

/// Bytes a tensor of `dims` (ggml order) and `ggml_type` takes, after validating the shape.
pub fn byte_size(dims: &[u64], ggml_type: GgmlType) -> Result<u64, Problem> {
    if dims.len() > MAX_DIMS {
        return Err(Problem::TooManyDims(dims.len() as u32));
    }
    for (index, &value) in dims.iter().enumerate() {
        if value == 0 || value > i64::MAX as u64 {
            return Err(Problem::BadDim { index, value });
        }
    }
    let overflow = |what| Problem::SizeOverflow {
        dims: dims.to_vec(),
        ggml_type,
        what,
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64 && usize::try_from(n).is_ok())
        .ok_or_else(|| overflow("element count"))?;
    let block_size = ggml_type.block_size() as u64;
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % block_size != 0 {
        return Err(Problem::NotBlockMultiple {
            ne0,
            ggml_type,
            block_size,
        });
    }
    ggml_type
        .row_bytes(n_elements)
        .ok_or_else(|| overflow("byte size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_is_reversed_dims() {
        let t = TensorInfo::new("w", vec![512, 3], GgmlType::Q4_K, 0).unwrap();
        assert_eq!(t.shape(), vec![3, 512]);
        assert_eq!(t.n_elements(), 1536);
        assert_eq!(t.n_bytes, 3 * 2 * 144);
        assert_eq!(t.row_bytes(), 288);
        assert_eq!(t.n_rows(), 3);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(matches!(
            byte_size(&[1, 1, 1, 1, 1], GgmlType::F32),
            Err(Problem::TooManyDims(5))
        ));
        assert!(matches!(
            byte_size(&[4, 0], GgmlType::F32),
            Err(Problem::BadDim { index: 1, value: 0 })
        ));
        assert!(matches!(
            byte_size(&[1 << 32, 1 << 32], GgmlType::F32),
            Err(Problem::SizeOverflow { .. })
        ));
        // Element count fits, byte size does not.
        assert!(matches!(
            byte_size(&[1 << 31, 1 << 31], GgmlType::F64),
            Err(Problem::SizeOverflow {
                what: "byte size",
                ..
            })
        ));
        // 64 elements but rows of 32: not whole K-quant blocks.
        assert!(matches!(
            byte_size(&[32, 8], GgmlType::Q4_K),
            Err(Problem::NotBlockMultiple { .. })
        ));
        assert_eq!(byte_size(&[], GgmlType::F32), Ok(4));
    }
}
