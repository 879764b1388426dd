//! Weight quantization for `QMatrix::quantize_from_f32` (tests, benches, and re-quantizing
//! checkpoints): ggml's reference quantizers from `mlaserve_gguf::quants`, one task per chunk
//! of rows.

use crate::error::BackendError;
use mlaserve_gguf::GgmlType;
use rayon::prelude::*;

/// Encode row-major `v` (rows of `cols` values, `cols` a whole number of blocks) as `ty`.
pub(crate) fn quantize_rows(ty: GgmlType, cols: usize, v: &[f32]) -> Result<Vec<u8>, BackendError> {
    let row_bytes = cols / ty.block_size() * ty.type_size();
    if cols == 0 || row_bytes == 0 {
        return Ok(Vec::new());
    }
    let mut out = vec![0u8; v.len() / cols * row_bytes];
    out.par_chunks_mut(row_bytes)
        .zip(v.par_chunks(cols))
        .with_min_len(16)
        .try_for_each(|(dst, src)| mlaserve_gguf::quants::quantize_into(ty, src, dst))
        .map_err(|e| BackendError::Quantize {
            ty,
            reason: e.to_string(),
        })?;
    Ok(out)
}
