//! K-quant super-blocks (QK_K = 256 elements): layouts and dequantization of Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K and Q8_K. The quantizers live in `k_quantize.rs`.
//!
//! Layouts are ggml's `block_q*_K` (ggml-common.h). Sub-block scales:
//! - Q2_K: 16 sub-blocks of 16, `scales[j]` = 4-bit scale (low) | 4-bit min (high);
//!   element = `d·sc·q − dmin·m`, q ∈ 0..4.
//! - Q3_K: 16 sub-blocks of 16 with 6-bit signed scales packed in 12 bytes (low nibbles in
//!   bytes 0..8, 2-bit highs in bytes 8..12); element = `d·(sc−32)·(q − 4·!hbit)`, q ∈ 0..4.
//! - Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes
//!   ([`get_scale_min_k4`]); element = `d·sc·q − dmin·m`, q ∈ 0..16 / 0..32.
//! - Q6_K: 16 sub-blocks of 16 with i8 scales; element = `d·sc·(q − 32)`, q ∈ 0..64.
//! - Q8_K: f32 scale, 256 × i8, and `bsums[j]` = sum of quants `16j..16j+16` (for kernels).
//!
//! Every `dequantize` evaluates the same f32 expression, in the same order, as ggml's
//! `dequantize_row_q*_K` (and gguf-py), so results are bit-exact.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::QuantBlock;
use crate::ggml_type::GgmlType;

/// `block_q2_K`: 2-bit quants, 4-bit scales and mins. 84 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per 16-element sub-block: scale (low nibble) and min (high nibble).
    pub scales: [u8; 16],
    /// Quants: byte `32·h + l` holds element `128h + l + 32k` in bits `2k..2k+2`.
    pub qs: [u8; 64],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}

/// `block_q3_K`: 3-bit quants (2 low bits + 1 high bit), 6-bit scales. 110 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bits: bit `k` of byte `l` belongs to element `32k + l`.
    pub hmask: [u8; 32],
    /// Low 2 bits, packed as in Q2_K.
    pub qs: [u8; 64],
    /// 16 six-bit scales (biased by 32), packed.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// `block_q4_K`: 4-bit quants, 6-bit scales and mins. 144 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each ([`get_scale_min_k4`]).
    pub scales: [u8; 12],
    /// Byte `32h + l`: element `64h + l` low nibble, `64h + 32 + l` high nibble.
    pub qs: [u8; 128],
}

/// `block_q5_K`: 5-bit quants, 6-bit scales and mins. 176 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each ([`get_scale_min_k4`]).
    pub scales: [u8; 12],
    /// Fifth bits: bit `k` of byte `l` belongs to element `32k + l`.
    pub qh: [u8; 32],
    /// Low nibbles, packed as in Q4_K.
    pub qs: [u8; 128],
}

/// `block_q6_K`: 6-bit quants, i8 scales. 210 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; 128],
    /// High 2 bits of the quants.
    pub qh: [u8; 64],
    /// One i8 scale per 16 elements.
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: f16,
}

/// `block_q8_K`: the activation format of the K-quant dot products. 292 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale (f32, unlike every other block).
    pub d: f32,
    /// Quants.
    pub qs: [i8; 256],
    /// `bsums[j]` = sum of `qs[16j..16j+16]`.
    pub bsums: [i16; 16],
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K `scales` array: bytes
/// 0..4 hold scales 0..4 (+ top bits of 4..8), bytes 4..8 mins 0..4 (+ top bits), bytes 8..12
/// the low nibbles of scales/mins 4..8.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 6-bit scale of Q3_K sub-block `j` (0..16), minus the bias 32.
#[inline]
pub(super) fn q3k_scale(scales: &[u8; 12], j: usize) -> i8 {
    let low = if j < 8 {
        scales[j] & 0xf
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

impl QuantBlock<256> for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    fn dequantize(&self, y: &mut [f32; 256]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        let mut is = 0;
        for (half, q) in self.qs.chunks_exact(32).enumerate() {
            for k in 0..4 {
                let shift = 2 * k;
                for part in 0..2 {
                    let sc = self.scales[is];
                    is += 1;
                    let dl = d * f32::from(sc & 0xf);
                    let ml = min * f32::from(sc >> 4);
                    let base = 128 * half + 32 * k + 16 * part;
                    for l in 0..16 {
                        let q = (q[16 * part + l] >> shift) & 3;
                        y[base + l] = dl * f32::from(q) - ml;
                    }
                }
            }
        }
    }
}

impl QuantBlock<256> for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    fn dequantize(&self, y: &mut [f32; 256]) {
        let d_all = self.d.to_f32();
        let mut is = 0;
        for (half, q) in self.qs.chunks_exact(32).enumerate() {
            for k in 0..4 {
                let shift = 2 * k;
                let bit = 4 * half + k;
                for part in 0..2 {
                    let dl = d_all * f32::from(q3k_scale(&self.scales, is));
                    is += 1;
                    let base = 128 * half + 32 * k + 16 * part;
                    for l in 0..16 {
                        let i = 16 * part + l;
                        let low = ((q[i] >> shift) & 3) as i8;
                        // 4 is subtracted when the high bit is clear.
                        let sub = ((!self.hmask[i] >> bit) & 1) << 2;
                        y[base + l] = dl * f32::from(low - sub as i8);
                    }
                }
            }
        }
    }
}

impl QuantBlock<256> for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    fn dequantize(&self, y: &mut [f32; 256]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (h, q) in self.qs.chunks_exact(32).enumerate() {
            let (sc1, m1) = get_scale_min_k4(2 * h, &self.scales);
            let (sc2, m2) = get_scale_min_k4(2 * h + 1, &self.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let base = 64 * h;
            for l in 0..32 {
                y[base + l] = d1 * f32::from(q[l] & 0xf) - m1;
                y[base + 32 + l] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

impl QuantBlock<256> for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    fn dequantize(&self, y: &mut [f32; 256]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (h, ql) in self.qs.chunks_exact(32).enumerate() {
            let (sc1, m1) = get_scale_min_k4(2 * h, &self.scales);
            let (sc2, m2) = get_scale_min_k4(2 * h + 1, &self.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let base = 64 * h;
            for l in 0..32 {
                // Bit 2h (2h + 1) of qh[l] is bit 4 of element 64h + l (64h + 32 + l).
                let hi1 = ((self.qh[l] >> (2 * h)) & 1) << 4;
                let hi2 = ((self.qh[l] >> (2 * h + 1)) & 1) << 4;
                y[base + l] = d1 * f32::from((ql[l] & 0xf) | hi1) - m1;
                y[base + 32 + l] = d2 * f32::from((ql[l] >> 4) | hi2) - m2;
            }
        }
    }
}

impl QuantBlock<256> for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    fn dequantize(&self, y: &mut [f32; 256]) {
        let d = self.d.to_f32();
        for n in 0..2 {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let sc = &self.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * f32::from(sc[is]) * f32::from(q1);
                y[l + 32] = d * f32::from(sc[is + 2]) * f32::from(q2);
                y[l + 64] = d * f32::from(sc[is + 4]) * f32::from(q3);
                y[l + 96] = d * f32::from(sc[is + 6]) * f32::from(q4);
            }
        }
    }
}

impl QuantBlock<256> for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    fn dequantize(&self, y: &mut [f32; 256]) {
        for (o, &q) in y.iter_mut().zip(&self.qs) {
            *o = self.d * f32::from(q);
        }
    }
}
