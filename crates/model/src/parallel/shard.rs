//! Which slice of the weights a tensor-parallel rank holds.
//!
//! Rank `r` of `w` holds, per layer (contiguous ranges, rank order):
//! - attention heads `r*N/w .. (r+1)*N/w`: their `q_b` rows, `w_uk`/`w_uk_t`/`w_uv` rows and
//!   `o_proj` columns, so `o_proj` yields a partial `[T, H]` that the ranks sum;
//! - the dense MLP, the shared experts and (TP) every routed expert: intermediate rows
//!   `r*F/w .. (r+1)*F/w` of gate/up and the same columns of down (a partial `[T, H]` again);
//! - with expert parallelism, whole routed experts `r*E/w .. (r+1)*E/w` instead;
//! - everything else whole: embeddings, norms, `q_a`, `kv_a`, the router, the DSA indexer,
//!   `lm_head` — every rank computes the same latent rows and the same top-k.
//!
//! A quantity that does not divide by `w` is an error at load naming it. Row slices share the
//! stored (quantized) bytes; a column slice stays in the stored type when it falls on block
//! boundaries and is dequantized to f32 otherwise (a `tracing::debug` line says so).

use crate::error::ModelError;
use mlaserve_backend::{Bytes, QMatrix};
use std::ops::Range;

/// One rank's share of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Whole routed experts per rank (contiguous ranges) instead of a slice of every expert.
    pub expert_parallel: bool,
}

impl Shard {
    /// This rank's range of `0..total`, or an error naming `what` when `total` does not divide
    /// by the world size.
    pub fn range(
        &self,
        total: usize,
        what: &str,
        source: &str,
    ) -> Result<Range<usize>, ModelError> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(ModelError::Config {
                source_name: source.to_string(),
                msg: format!("rank {} of a {}-rank group", self.rank, self.world_size),
            });
        }
        if !total.is_multiple_of(self.world_size) {
            return Err(ModelError::Config {
                source_name: source.to_string(),
                msg: format!(
                    "{what} = {total} is not divisible by the tensor-parallel size {}",
                    self.world_size
                ),
            });
        }
        let per = total / self.world_size;
        Ok(self.rank * per..(self.rank + 1) * per)
    }
}

/// Columns `cols` of `m` (`[rows, cols.len()]`). Stays in the stored type when both ends fall
/// on the type's block boundaries; otherwise dequantized to f32.
pub fn cols_slice(m: &QMatrix, cols: Range<usize>, tensor: &str) -> QMatrix {
    assert!(
        cols.start <= cols.end && cols.end <= m.cols,
        "cols_slice {cols:?} of a {}-column matrix",
        m.cols
    );
    if cols.start == 0 && cols.end == m.cols {
        return m.clone();
    }
    let n = cols.len();
    let block = m.ty.block_size();
    if cols.start.is_multiple_of(block) && n.is_multiple_of(block) {
        let ts = m.ty.type_size();
        let (b0, nb) = (cols.start / block * ts, n / block * ts);
        let mut data = Vec::with_capacity(m.rows * nb);
        for r in 0..m.rows {
            data.extend_from_slice(&m.row(r)[b0..b0 + nb]);
        }
        return QMatrix::new(m.ty, m.rows, n, Bytes::from_vec(data))
            .expect("whole blocks of a valid matrix form a valid matrix");
    }
    tracing::debug!(
        tensor,
        ty = %m.ty,
        "columns {cols:?} are not aligned to the {block}-element blocks: slice dequantized to f32"
    );
    let mut row = vec![0f32; m.cols];
    let mut v = Vec::with_capacity(m.rows * n);
    for r in 0..m.rows {
        m.dequantize_row(r, &mut row);
        v.extend_from_slice(&row[cols.clone()]);
    }
    QMatrix::from_f32(m.rows, n, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlaserve_gguf::GgmlType;

    #[test]
    fn ranges_split_evenly_or_name_the_quantity() {
        let s = |rank| Shard {
            rank,
            world_size: 4,
            expert_parallel: false,
        };
        assert_eq!(s(0).range(8, "heads", "f").unwrap(), 0..2);
        assert_eq!(s(3).range(8, "heads", "f").unwrap(), 6..8);
        let e = s(1)
            .range(6, "num_heads", "m.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_heads = 6")
                && e.contains("tensor-parallel size 4")
                && e.contains("m.gguf"),
            "{e}"
        );
    }

    #[test]
    fn aligned_column_slices_stay_quantized_and_exact() {
        let (rows, cols) = (3, 128);
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5)
            .collect();
        let m = QMatrix::quantize_from_f32(GgmlType::Q8_0, rows, cols, &v).unwrap();
        let full = m.to_f32();
        let s = cols_slice(&m, 32..96, "t");
        assert_eq!((s.ty, s.rows, s.cols), (GgmlType::Q8_0, 3, 64));
        let got = s.to_f32();
        for r in 0..rows {
            assert_eq!(
                &got[r * 64..(r + 1) * 64],
                &full[r * cols + 32..r * cols + 96]
            );
        }
        // Not on a block boundary: f32 with the same values.
        let u = cols_slice(&m, 16..48, "t");
        assert_eq!((u.ty, u.cols), (GgmlType::F32, 32));
        let got = u.to_f32();
        for r in 0..rows {
            assert_eq!(
                &got[r * 32..(r + 1) * 32],
                &full[r * cols + 16..r * cols + 48]
            );
        }
    }
}
