//! Legacy 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Layouts are ggml's `block_q*` (ggml-common.h). In the 4/5-bit formats byte `j` of `qs`
//! holds element `j` in its low nibble and element `j + 16` in its high nibble; Q5's `qh` is a
//! little-endian u32 whose bit `j` is bit 4 of element `j`. Value of element `i`:
//! - Q4_0 / Q5_0: `(q - 8|16) * d`;  Q4_1 / Q5_1: `q * d + m`;  Q8_0 / Q8_1: `q * d`
//!   (Q8_1's `s = d * Σq` is only read by dot-product kernels).
//!
//! Quantizers mirror `quantize_row_q*_ref` (ggml-quants.c); see the module docs of
//! `quants` for the bit-exactness contract.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::{QuantBlock, QuantizeBlock};
use crate::ggml_type::GgmlType;

/// `block_q4_0`: 32 × 4-bit, symmetric, one f16 scale. 18 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: element `j` low, `j + 16` high.
    pub qs: [u8; 16],
}

/// `block_q4_1`: 32 × 4-bit with scale and min. 20 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Min (added after scaling).
    pub m: f16,
    /// Nibbles: element `j` low, `j + 16` high.
    pub qs: [u8; 16],
}

/// `block_q5_0`: 32 × 5-bit, symmetric. 22 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, a little-endian u32: bit `j` belongs to element `j`.
    pub qh: [u8; 4],
    /// Low nibbles: element `j` low, `j + 16` high.
    pub qs: [u8; 16],
}

/// `block_q5_1`: 32 × 5-bit with scale and min. 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Min.
    pub m: f16,
    /// Fifth bits, a little-endian u32: bit `j` belongs to element `j`.
    pub qh: [u8; 4],
    /// Low nibbles: element `j` low, `j + 16` high.
    pub qs: [u8; 16],
}

/// `block_q8_0`: 32 × i8 with one f16 scale. 34 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; 32],
}

/// `block_q8_1`: 32 × i8 with scale `d` and `s = d * Σ qs`. 36 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quants.
    pub qs: [i8; 32],
}

/// The element with the largest magnitude (the first one on ties), as the
/// `amax < fabsf(v)` loops of ggml pick it.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `MAX(amax, fabsf(v))` over the block.
#[inline]
fn absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

/// `(min, max)` starting from `(FLT_MAX, -FLT_MAX)`.
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

impl QuantBlock<32> for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl QuantizeBlock<32> for BlockQ4_0 {
    fn quantize(x: &[f32; 32]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = inverse_or_zero(d);
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            let xi0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let xi1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            *q = xi0 | (xi1 << 4);
        }
        Self {
            d: f16::from_f32(d),
            qs,
        }
    }
}

impl QuantBlock<32> for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = (q & 0x0f) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

impl QuantizeBlock<32> for BlockQ4_1 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse_or_zero(d);
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            let xi0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let xi1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            *q = xi0 | (xi1 << 4);
        }
        Self {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qs,
        }
    }
}

/// Pack 32 five-bit values (element `j` and `j + 16` share `qs[j]`) into `(qh, qs)`.
#[inline]
fn pack_q5(q: impl Fn(usize) -> u8) -> ([u8; 4], [u8; 16]) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for (j, byte) in qs.iter_mut().enumerate() {
        let (xi0, xi1) = (q(j), q(j + 16));
        *byte = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
        qh |= (u32::from(xi0 & 0x10) >> 4) << j;
        qh |= (u32::from(xi1 & 0x10) >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

/// The 5-bit value of element `j` (0..16) and `j + 16` from `qs`/`qh`.
#[inline]
fn unpack_q5(qh: u32, qs: &[u8; 16], j: usize) -> (i32, i32) {
    let xh_0 = ((qh >> j) << 4) & 0x10;
    let xh_1 = (qh >> (j + 12)) & 0x10;
    (
        (u32::from(qs[j] & 0x0f) | xh_0) as i32,
        (u32::from(qs[j] >> 4) | xh_1) as i32,
    )
}

impl QuantBlock<32> for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let (x0, x1) = unpack_q5(qh, &self.qs, j);
            y[j] = (x0 - 16) as f32 * d;
            y[j + 16] = (x1 - 16) as f32 * d;
        }
    }
}

impl QuantizeBlock<32> for BlockQ5_0 {
    fn quantize(x: &[f32; 32]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = inverse_or_zero(d);
        let (qh, qs) = pack_q5(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
        Self {
            d: f16::from_f32(d),
            qh,
            qs,
        }
    }
}

impl QuantBlock<32> for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let (x0, x1) = unpack_q5(qh, &self.qs, j);
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }
}

impl QuantizeBlock<32> for BlockQ5_1 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse_or_zero(d);
        // ggml converts with `(uint8_t)(x0 + 0.5f)` here, without the MIN(31, ..) clamp.
        let (qh, qs) = pack_q5(|j| ((x[j] - min) * id + 0.5) as u8);
        Self {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qh,
            qs,
        }
    }
}

impl QuantBlock<32> for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for (o, &q) in y.iter_mut().zip(&self.qs) {
            *o = f32::from(q) * d;
        }
    }
}

/// C's `roundf` (half away from zero) for |x| < 2^31, without a libm call: `a − trunc(a)` is
/// exact in f32, so comparing it with 0.5 decides exactly. NaN gives 0.
#[inline]
fn round_half_away(x: f32) -> i32 {
    let a = x.abs();
    let t = a as i32;
    let r = t + i32::from(a - t as f32 >= 0.5);
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// `d = amax / 127`, `q = roundf(x / d)`, as Q8_0 and Q8_1 share.
#[inline]
fn quantize_q8(x: &[f32; 32]) -> (f32, [i8; 32]) {
    let d = absmax(x) / 127.0;
    let id = inverse_or_zero(d);
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_half_away(v * id) as i8;
    }
    (d, qs)
}

impl QuantizeBlock<32> for BlockQ8_0 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (d, qs) = quantize_q8(x);
        Self {
            d: f16::from_f32(d),
            qs,
        }
    }
}

impl QuantBlock<32> for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for (o, &q) in y.iter_mut().zip(&self.qs) {
            *o = f32::from(q) * d;
        }
    }
}

impl QuantizeBlock<32> for BlockQ8_1 {
    fn quantize(x: &[f32; 32]) -> Self {
        let (d, qs) = quantize_q8(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        Self {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::round_half_away;

    #[test]
    fn round_half_away_matches_f32_round() {
        let cases = [
            0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, 126.5, -127.49999, 1e9,
        ];
        for x in cases {
            assert_eq!(round_half_away(x), x.round() as i32, "{x}");
        }
        let mut v = -130.0f32;
        while v < 130.0 {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
            v = v.next_up();
            v += 0.003;
        }
        assert_eq!(round_half_away(f32::NAN), 0);
    }
}
