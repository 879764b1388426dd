//! MXFP4 (OCP microscaling FP4): 32 E2M1 values sharing one E8M0 exponent. 17 bytes.
//!
//! ggml stores the E2M1 codes as indices into [`KVALUES_MXFP4`] (twice the E2M1 values) and
//! compensates with half the E8M0 scale ([`e8m0_to_f32_half`] = 2^(e−128)), so an element
//! is `KVALUES_MXFP4[code] · 2^(e−128)`. Nibble packing is the legacy one (byte `j`: element
//! `j` low, `j + 16` high). The quantizer is `quantize_row_mxfp4_ref`: `e = ⌊log2 amax⌋ − 2 +
//! 127` and, per element, the first code with the smallest `|kvalue·d − x|`.

use bytemuck::{Pod, Zeroable};

use super::{QuantBlock, QuantizeBlock};
use crate::ggml_type::GgmlType;

/// E2M1 values doubled, indexed by the 4-bit code (`kvalues_mxfp4`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `block_mxfp4`: shared exponent and 32 four-bit codes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// E8M0 exponent (bias 127).
    pub e: u8,
    /// Codes: element `j` low nibble, `j + 16` high nibble.
    pub qs: [u8; 16],
}

/// Half the E8M0 scale, 2^(x−128), exactly as ggml's `ggml_e8m0_to_fp32_half` (subnormal
/// for x < 2; x = 255 gives 2^127, not NaN).
#[inline]
pub fn e8m0_to_f32_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        u32::from(x - 1) << 23
    };
    f32::from_bits(bits)
}

/// `best_index_mxfp4`: the first code minimizing `|kvalue·d − x|`.
#[inline]
fn best_index(x: f32, d: f32) -> u8 {
    let mut best_index = 0;
    let mut best_err = (f32::from(KVALUES_MXFP4[0]) * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (f32::from(k) * d - x).abs();
        if err < best_err {
            best_index = i as u8;
            best_err = err;
        }
    }
    best_index
}

impl QuantBlock<32> for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = e8m0_to_f32_half(self.e);
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = f32::from(KVALUES_MXFP4[usize::from(q & 0xf)]) * d;
            y[j + 16] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    }
}

impl QuantizeBlock<32> for BlockMXFP4 {
    fn quantize(x: &[f32; 32]) -> Self {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // C converts the float expression with `(uint8_t)`; in range the conversions agree.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
        }
        Self { e, qs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_scale_is_two_to_the_e_minus_128() {
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }
}
