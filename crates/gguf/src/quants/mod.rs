//! ggml block formats: dequantization of every supported [`GgmlType`] to `f32`, and the
//! reference (non-imatrix) quantizers of llama.cpp's `ggml-quants.c`.
//!
//! Two levels of API:
//! - byte level, for whole rows or tensors of any type: [`dequantize`] / [`dequantize_row`],
//!   [`quantize`] (appends to a `Vec<u8>`) / [`quantize_into`] (fills a slice),
//!   [`can_quantize`] / [`can_dequantize`];
//! - typed blocks for kernels: `#[repr(C)]` structs laid out exactly as ggml's `block_*`
//!   (e.g. [`BlockQ8_0`], [`BlockQ4K`], [`BlockQ8K`]), all [`bytemuck::Pod`], viewed
//!   zero-copy over tensor bytes with [`cast_blocks`], converted one block at a time with
//!   [`QuantBlock::dequantize`] / [`QuantizeBlock::quantize`], or a row at a time with
//!   [`dequantize_blocks`] / [`quantize_blocks`] (no allocation).
//!
//! Invariants:
//! - `size_of::<Block*>() == ty.type_size()` and every block holds `ty.block_size()` elements
//!   (checked at compile time below); blocks are stored little-endian, so this module only
//!   builds for little-endian targets.
//! - Dequantization is bit-exact against gguf-py 0.19.0 (`gguf.quants.dequantize`), which
//!   uses the same per-element operation order as ggml's `dequantize_row_*` (no FMA).
//! - Quantization follows `quantize_row_*_ref` operation by operation in `f32` (f16 fields
//!   via `half`, round-to-nearest-even; `nearest_int` via the 1.5·2^23 trick; C float→int
//!   conversions truncate), so its bytes equal a build of ggml-quants.c without FMA
//!   contraction, and gguf-py's `quantize` where gguf-py has one.
//! - Nothing here panics on bad lengths or unaligned bytes: lengths are [`QuantError`]s, and
//!   unaligned block bytes are read through a copy.

mod float;
mod iq;
mod k_dequant;
mod k_quantize;
mod k_search;
mod legacy;
mod mxfp4;

use bytemuck::Pod;

use crate::ggml_type::GgmlType;

pub use float::{bf16_from_f32, bf16_to_f32};
pub use iq::{BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};
pub use k_dequant::{get_scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
pub use mxfp4::{e8m0_to_f32_half, BlockMXFP4, KVALUES_MXFP4};

#[cfg(target_endian = "big")]
compile_error!("ggml blocks are little-endian; the quants module reads them in place");

/// Elements per block of the legacy formats (Q4_0 … Q8_1, IQ4_NL, MXFP4).
pub const QK32: usize = 32;
/// Elements per super-block of the K-quants and IQ4_XS (= [`crate::QK_K`]).
pub const QK256: usize = crate::ggml_type::QK_K;

/// A length or type problem in a (de)quantization call.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error("{ty}: {elements} elements is not a multiple of the block size {block_size}")]
    PartialBlock {
        /// The type being converted.
        ty: GgmlType,
        /// Elements requested.
        elements: usize,
        /// Elements per block of `ty`.
        block_size: usize,
    },
    /// The byte count does not match the element count.
    #[error("{ty}: {elements} elements need {expected} bytes, got {got}")]
    ByteLength {
        /// The type being converted.
        ty: GgmlType,
        /// Elements requested.
        elements: usize,
        /// Bytes `elements` take in `ty`.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The block count does not match the element count (typed-block APIs).
    #[error("{ty}: {elements} elements need {expected} blocks, got {got}")]
    BlockCount {
        /// The block type.
        ty: GgmlType,
        /// Elements given.
        elements: usize,
        /// Blocks `elements` take.
        expected: usize,
        /// Blocks given.
        got: usize,
    },
    /// [`cast_blocks`] got bytes that are not aligned for the block struct.
    #[error("{ty}: block bytes at address {addr:#x} are not aligned to {align}")]
    Misaligned {
        /// The block type.
        ty: GgmlType,
        /// Address of the first byte.
        addr: usize,
        /// Alignment the block struct needs.
        align: usize,
    },
    /// This module has no dequantizer for the type.
    #[error("dequantization of {0} is not supported")]
    UnsupportedDequantize(GgmlType),
    /// This module has no reference quantizer for the type.
    #[error("quantization to {0} is not supported")]
    UnsupportedQuantize(GgmlType),
}

/// A ggml block: `QK` elements in `size_of::<Self>() == Self::TYPE.type_size()` bytes.
pub trait QuantBlock<const QK: usize>: Pod {
    /// The ggml type whose blocks this struct holds.
    const TYPE: GgmlType;
    /// Write the block's `QK` values to `out`.
    fn dequantize(&self, out: &mut [f32; QK]);
}

/// A block type with a reference quantizer.
pub trait QuantizeBlock<const QK: usize>: QuantBlock<QK> {
    /// Quantize `QK` values as llama.cpp's `quantize_row_*_ref` does.
    fn quantize(x: &[f32; QK]) -> Self;
}

/// Whether [`dequantize`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ4_NL
            | IQ4_XS
            | MXFP4
    )
}

/// Whether [`quantize`] supports `ty` (every type [`dequantize`] supports has a reference
/// quantizer in ggml, so the two sets are equal).
pub fn can_quantize(ty: GgmlType) -> bool {
    can_dequantize(ty)
}

/// Check that `elements` is whole blocks of `ty` taking exactly `bytes` bytes.
fn check_lengths(ty: GgmlType, elements: usize, bytes: usize) -> Result<(), QuantError> {
    let block_size = ty.block_size();
    if !elements.is_multiple_of(block_size) {
        return Err(QuantError::PartialBlock {
            ty,
            elements,
            block_size,
        });
    }
    let expected = elements / block_size * ty.type_size();
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ty,
            elements,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Dequantize `data` (whole blocks of `ty`) into `out`; `out.len()` is the element count.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if !can_dequantize(ty) {
        return Err(QuantError::UnsupportedDequantize(ty));
    }
    check_lengths(ty, out.len(), data.len())?;
    use GgmlType::*;
    match ty {
        F32 => float::f32_from_bytes(data, out),
        F16 => float::f16_from_bytes(data, out),
        BF16 => float::bf16_from_bytes(data, out),
        Q4_0 => dequantize_bytes::<32, BlockQ4_0>(data, out),
        Q4_1 => dequantize_bytes::<32, BlockQ4_1>(data, out),
        Q5_0 => dequantize_bytes::<32, BlockQ5_0>(data, out),
        Q5_1 => dequantize_bytes::<32, BlockQ5_1>(data, out),
        Q8_0 => dequantize_bytes::<32, BlockQ8_0>(data, out),
        Q8_1 => dequantize_bytes::<32, BlockQ8_1>(data, out),
        Q2_K => dequantize_bytes::<256, BlockQ2K>(data, out),
        Q3_K => dequantize_bytes::<256, BlockQ3K>(data, out),
        Q4_K => dequantize_bytes::<256, BlockQ4K>(data, out),
        Q5_K => dequantize_bytes::<256, BlockQ5K>(data, out),
        Q6_K => dequantize_bytes::<256, BlockQ6K>(data, out),
        Q8_K => dequantize_bytes::<256, BlockQ8K>(data, out),
        IQ4_NL => dequantize_bytes::<32, BlockIQ4NL>(data, out),
        IQ4_XS => dequantize_bytes::<256, BlockIQ4XS>(data, out),
        MXFP4 => dequantize_bytes::<32, BlockMXFP4>(data, out),
        _ => return Err(QuantError::UnsupportedDequantize(ty)),
    }
    Ok(())
}

/// Dequantize one row; the same as [`dequantize`], named for per-row callers.
#[inline]
pub fn dequantize_row(ty: GgmlType, row_bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    dequantize(ty, row_bytes, out)
}

/// Quantize `src` (whole blocks of `ty`) and append the bytes to `out`.
pub fn quantize(ty: GgmlType, src: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    if !can_quantize(ty) {
        return Err(QuantError::UnsupportedQuantize(ty));
    }
    let block_size = ty.block_size();
    if !src.len().is_multiple_of(block_size) {
        return Err(QuantError::PartialBlock {
            ty,
            elements: src.len(),
            block_size,
        });
    }
    let start = out.len();
    out.resize(start + src.len() / block_size * ty.type_size(), 0);
    quantize_into(ty, src, &mut out[start..])
}

/// Quantize `src` (whole blocks of `ty`) into `dst`, which must be exactly its byte size.
pub fn quantize_into(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !can_quantize(ty) {
        return Err(QuantError::UnsupportedQuantize(ty));
    }
    check_lengths(ty, src.len(), dst.len())?;
    use GgmlType::*;
    match ty {
        F32 => float::f32_to_bytes(src, dst),
        F16 => float::f16_to_bytes(src, dst),
        BF16 => float::bf16_to_bytes(src, dst),
        Q4_0 => quantize_bytes::<32, BlockQ4_0>(src, dst),
        Q4_1 => quantize_bytes::<32, BlockQ4_1>(src, dst),
        Q5_0 => quantize_bytes::<32, BlockQ5_0>(src, dst),
        Q5_1 => quantize_bytes::<32, BlockQ5_1>(src, dst),
        Q8_0 => quantize_bytes::<32, BlockQ8_0>(src, dst),
        Q8_1 => quantize_bytes::<32, BlockQ8_1>(src, dst),
        Q2_K => quantize_bytes::<256, BlockQ2K>(src, dst),
        Q3_K => quantize_bytes::<256, BlockQ3K>(src, dst),
        Q4_K => quantize_bytes::<256, BlockQ4K>(src, dst),
        Q5_K => quantize_bytes::<256, BlockQ5K>(src, dst),
        Q6_K => quantize_bytes::<256, BlockQ6K>(src, dst),
        Q8_K => quantize_bytes::<256, BlockQ8K>(src, dst),
        IQ4_NL => quantize_bytes::<32, BlockIQ4NL>(src, dst),
        IQ4_XS => quantize_bytes::<256, BlockIQ4XS>(src, dst),
        MXFP4 => quantize_bytes::<32, BlockMXFP4>(src, dst),
        _ => return Err(QuantError::UnsupportedQuantize(ty)),
    }
    Ok(())
}

/// View `bytes` as blocks of `B` without copying. Errors if the length is not whole blocks
/// or the address is not aligned for `B` (mmapped GGUF tensor data is 32-byte aligned).
pub fn cast_blocks<const QK: usize, B: QuantBlock<QK>>(bytes: &[u8]) -> Result<&[B], QuantError> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        let elements = bytes.len() / size * QK;
        return Err(QuantError::ByteLength {
            ty: B::TYPE,
            elements,
            expected: elements / QK * size,
            got: bytes.len(),
        });
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| QuantError::Misaligned {
        ty: B::TYPE,
        addr: bytes.as_ptr() as usize,
        align: align_of::<B>(),
    })
}

/// Dequantize a row of typed blocks into `out` (`out.len() == blocks.len() * QK`).
pub fn dequantize_blocks<const QK: usize, B: QuantBlock<QK>>(
    blocks: &[B],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_block_count::<QK>(B::TYPE, out.len(), blocks.len())?;
    for (block, chunk) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        if let Ok(chunk) = <&mut [f32; QK]>::try_from(chunk) {
            block.dequantize(chunk);
        }
    }
    Ok(())
}

/// Quantize `x` into typed blocks (`x.len() == out.len() * QK`), e.g. activations to
/// [`BlockQ8_0`] / [`BlockQ8_1`] / [`BlockQ8K`] for a dot-product kernel.
pub fn quantize_blocks<const QK: usize, B: QuantizeBlock<QK>>(
    x: &[f32],
    out: &mut [B],
) -> Result<(), QuantError> {
    check_block_count::<QK>(B::TYPE, x.len(), out.len())?;
    for (block, chunk) in out.iter_mut().zip(x.chunks_exact(QK)) {
        if let Ok(chunk) = <&[f32; QK]>::try_from(chunk) {
            *block = B::quantize(chunk);
        }
    }
    Ok(())
}

fn check_block_count<const QK: usize>(
    ty: GgmlType,
    elements: usize,
    blocks: usize,
) -> Result<(), QuantError> {
    if !elements.is_multiple_of(QK) {
        return Err(QuantError::PartialBlock {
            ty,
            elements,
            block_size: QK,
        });
    }
    if elements / QK != blocks {
        return Err(QuantError::BlockCount {
            ty,
            elements,
            expected: elements / QK,
            got: blocks,
        });
    }
    Ok(())
}

/// Dequantize whole blocks; lengths were checked by the caller. Aligned bytes are read in
/// place, unaligned ones through a per-block copy.
fn dequantize_bytes<const QK: usize, B: QuantBlock<QK>>(data: &[u8], out: &mut [f32]) {
    let chunks = out.chunks_exact_mut(QK);
    match bytemuck::try_cast_slice::<u8, B>(data) {
        Ok(blocks) => {
            for (block, chunk) in blocks.iter().zip(chunks) {
                if let Ok(chunk) = <&mut [f32; QK]>::try_from(chunk) {
                    block.dequantize(chunk);
                }
            }
        }
        Err(_) => {
            for (bytes, chunk) in data.chunks_exact(size_of::<B>()).zip(chunks) {
                let block: B = bytemuck::pod_read_unaligned(bytes);
                if let Ok(chunk) = <&mut [f32; QK]>::try_from(chunk) {
                    block.dequantize(chunk);
                }
            }
        }
    }
}

/// Quantize whole blocks into bytes; lengths were checked by the caller.
fn quantize_bytes<const QK: usize, B: QuantizeBlock<QK>>(src: &[f32], dst: &mut [u8]) {
    for (x, bytes) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(size_of::<B>()))
    {
        if let Ok(x) = <&[f32; QK]>::try_from(x) {
            bytes.copy_from_slice(bytemuck::bytes_of(&B::quantize(x)));
        }
    }
}

/// Compile-time layout check: each block struct has ggml's byte size for its type (the
/// same numbers as `GgmlType::type_size`, which the integration tests compare at run time).
macro_rules! assert_size {
    ($($block:ty => $bytes:expr;)*) => {
        $(const _: () = assert!(size_of::<$block>() == $bytes);)*
    };
}

assert_size! {
    BlockQ4_0 => 18;
    BlockQ4_1 => 20;
    BlockQ5_0 => 22;
    BlockQ5_1 => 24;
    BlockQ8_0 => 34;
    BlockQ8_1 => 36;
    BlockQ2K => 84;
    BlockQ3K => 110;
    BlockQ4K => 144;
    BlockQ5K => 176;
    BlockQ6K => 210;
    BlockQ8K => 292;
    BlockIQ4NL => 18;
    BlockIQ4XS => 136;
    BlockMXFP4 => 17;
}
