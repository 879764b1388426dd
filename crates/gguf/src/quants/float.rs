//! Plain float element types: F32, F16, BF16 (one element per "block").
//!
//! Invariants: F16 ↔ f32 uses IEEE round-to-nearest-even (`half`, F16C where present), the
//! same as numpy's `astype(float16)` and ggml's `GGML_FP32_TO_FP16`. NaNs follow numpy (the
//! gguf-py reference): payload bits are copied without setting the quiet bit, where F16C and
//! ggml would quiet them. BF16 rounding is ggml's `ggml_compute_fp32_to_bf16`
//! (round-to-nearest-even on the top 16 bits, NaN forced quiet), which gguf-py's
//! `BF16.quantize_blocks` reproduces. Lengths were checked by the caller.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// bf16 bits → f32 (exact: the bits become the top half of the f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 → bf16 bits as ggml rounds: nearest-even on the dropped 16 bits; a NaN keeps its top
/// bits with the quiet bit (0x40) set.
#[inline]
pub fn bf16_from_f32(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// f16 NaN bits → f32 as numpy converts them: sign and payload copied, not quieted.
#[inline]
fn f16_nan_to_f32(h: u16) -> f32 {
    f32::from_bits((u32::from(h & 0x8000) << 16) | 0x7f80_0000 | (u32::from(h & 0x03ff) << 13))
}

/// f32 NaN → f16 bits as numpy converts it: the top 10 payload bits, kept a NaN.
#[inline]
fn f32_nan_to_f16(x: f32) -> u16 {
    let f = x.to_bits();
    let mut ret = 0x7c00 + ((f & 0x007f_ffff) >> 13) as u16;
    if ret == 0x7c00 {
        ret += 1;
    }
    ((f >> 16) as u16 & 0x8000) | ret
}

pub(super) fn f32_from_bytes(data: &[u8], out: &mut [f32]) {
    bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(data);
}

pub(super) fn f16_from_bytes(data: &[u8], out: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, f16>(data) {
        Ok(halves) => halves.convert_to_f32_slice(out),
        Err(_) => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    }
    // A branch-free scan first: NaNs are rare, the fix-up loop is not vectorized.
    if out.iter().fold(false, |any, v| any | v.is_nan()) {
        for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
            if o.is_nan() {
                *o = f16_nan_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

pub(super) fn bf16_from_bytes(data: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(super) fn f32_to_bytes(src: &[f32], dst: &mut [u8]) {
    dst.copy_from_slice(bytemuck::cast_slice(src));
}

pub(super) fn f16_to_bytes(src: &[f32], dst: &mut [u8]) {
    match bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
        Ok(halves) => halves.convert_from_f32_slice(src),
        Err(_) => {
            for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
                b.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
    }
    if src.iter().fold(false, |any, v| any | v.is_nan()) {
        for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
            if x.is_nan() {
                b.copy_from_slice(&f32_nan_to_f16(*x).to_le_bytes());
            }
        }
    }
}

pub(super) fn bf16_to_bytes(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&bf16_from_f32(*x).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        // 1 + 2^-8 is a tie between 1.0 and 1 + 2^-7: even mantissa (1.0) wins.
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 ties to the even 1 + 2^-6.
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(bf16_from_f32(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_from_f32(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_to_f32(0xbf80), -1.0);
    }

    #[test]
    fn f16_nans_keep_numpy_payloads() {
        assert_eq!(f16_nan_to_f32(0x7c01).to_bits(), 0x7f80_2000);
        assert_eq!(f16_nan_to_f32(0xfe00).to_bits(), 0xffc0_0000);
        assert_eq!(f32_nan_to_f16(f32::from_bits(0x7f80_0001)), 0x7c01);
        assert_eq!(f32_nan_to_f16(f32::from_bits(0xff81_2345)), 0xfc09);
        assert_eq!(f32_nan_to_f16(f32::from_bits(0x7fc0_0001)), 0x7e00);
    }
}
