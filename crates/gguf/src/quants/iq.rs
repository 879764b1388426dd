//! Non-linear 4-bit formats IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks
//! of 8 × 32 with 6-bit sub-block scales). Each nibble indexes [`KVALUES_IQ4NL`].
//!
//! Layouts are ggml's `block_iq4_nl` / `block_iq4_xs`; nibble packing per 32 elements is the
//! legacy one (byte `j`: element `j` low, `j + 16` high). IQ4_XS sub-block `ib` has scale
//! `ls = (scales_l nibble ib) | ((scales_h >> 2ib) & 3) << 4` and value `d·(ls − 32)·kvalue`.
//!
//! The quantizer is `quantize_row_iq4_nl_impl` without importance weights (weights `x²`),
//! with `ntry = -1` for IQ4_NL (`quantize_row_iq4_nl_ref`) and `ntry = 7` for IQ4_XS
//! (`quantize_row_iq4_xs_ref` calls `quantize_iq4_xs`). One deliberate difference: an
//! all-zero sub-block gets quant indices 0, as in current llama.cpp; older ggml-quants.c left
//! them unwritten (stack garbage). Its scale is 0 either way, so the values agree.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::k_search::{nearest_int, GROUP_MAX_EPS};
use super::{QuantBlock, QuantizeBlock};
use crate::ggml_type::GgmlType;

/// The 16 levels of IQ4_NL / IQ4_XS (`kvalues_iq4nl`), sorted.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `block_iq4_nl`: 32 × 4-bit indices into [`KVALUES_IQ4NL`], one f16 scale. 18 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4NL {
    /// Scale.
    pub d: f16,
    /// Nibbles: element `j` low, `j + 16` high.
    pub qs: [u8; 16],
}

/// `block_iq4_xs`: 256 × 4-bit indices, 8 six-bit sub-block scales. 136 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4XS {
    /// Super-block scale.
    pub d: f16,
    /// High 2 bits of the 8 sub-block scales (bits `2ib..2ib+2`).
    pub scales_h: u16,
    /// Low 4 bits of the sub-block scales, two per byte (even `ib` low nibble).
    pub scales_l: [u8; 4],
    /// Nibbles, 16 bytes per 32-element sub-block.
    pub qs: [u8; 128],
}

/// Index of the level of `values` (sorted) nearest to `x`, the upper one on ties; as
/// ggml-quants.c's `best_index_int8`.
#[inline]
fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    let n = values.len();
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[n - 1]) {
        return n - 1;
    }
    let (mut ml, mut mu) = (0, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < f32::from(values[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - f32::from(values[mu - 1]) < f32::from(values[mu]) - x {
        mu - 1
    } else {
        mu
    }
}

/// Pack 4-bit indices: per 32 elements, byte `j` = `L[j] | L[j + 16] << 4`.
fn pack_nibbles(ls: &[u8], qs: &mut [u8]) {
    for (l32, q16) in ls.chunks_exact(32).zip(qs.chunks_exact_mut(16)) {
        for (j, q) in q16.iter_mut().enumerate() {
            *q = l32[j] | (l32[j + 16] << 4);
        }
    }
}

/// Weighted error terms `(Σ w·q·x, Σ w·q²)` of quantizing `xb` with inverse scale `id`,
/// storing the chosen indices in `lb` when given.
#[inline]
fn fit(xb: &[f32], id: f32, mut lb: Option<&mut [u8]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, &x) in xb.iter().enumerate() {
        let l = best_index_int8(&KVALUES_IQ4NL, id * x);
        if let Some(lb) = lb.as_deref_mut() {
            lb[j] = l as u8;
        }
        let q = f32::from(KVALUES_IQ4NL[l]);
        let w = x * x;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The best scale of one 32-element sub-block (`quantize_row_iq4_nl_impl`'s inner loop);
/// fills `lb` with the indices of the first trial.
fn sub_block_scale(xb: &[f32], lb: &mut [u8], ntry: i32) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        lb.fill(0);
        return 0.0;
    }
    let v0 = f32::from(KVALUES_IQ4NL[0]);
    let d = if ntry > 0 { -max / v0 } else { max / v0 };
    let (sumqx, sumq2) = fit(xb, 1.0 / d, Some(lb));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        let id = (itry + i32::from(KVALUES_IQ4NL[0])) as f32 / max;
        let (sumqx, sumq2) = fit(xb, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

impl QuantBlock<32> for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0xf)]);
            y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

impl QuantizeBlock<32> for BlockIQ4NL {
    fn quantize(x: &[f32; 32]) -> Self {
        let mut ls = [0u8; 32];
        let d = sub_block_scale(x, &mut ls, -1);
        let mut qs = [0u8; 16];
        pack_nibbles(&ls, &mut qs);
        Self {
            d: f16::from_f32(d),
            qs,
        }
    }
}

impl QuantBlock<256> for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    fn dequantize(&self, y: &mut [f32; 256]) {
        let d = self.d.to_f32();
        for (ib, (q16, y32)) in self
            .qs
            .chunks_exact(16)
            .zip(y.chunks_exact_mut(32))
            .enumerate()
        {
            let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
            let high = ((self.scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
            for (j, &q) in q16.iter().enumerate() {
                y32[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0xf)]);
                y32[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
            }
        }
    }
}

impl QuantizeBlock<256> for BlockIQ4XS {
    fn quantize(x: &[f32; 256]) -> Self {
        let mut ls = [0u8; 256];
        let mut scales = [0.0f32; 8];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for (ib, scale) in scales.iter_mut().enumerate() {
            let r = 32 * ib..32 * ib + 32;
            *scale = sub_block_scale(&x[r.clone()], &mut ls[r], 7);
            if scale.abs() > amax_scale {
                amax_scale = scale.abs();
                max_scale = *scale;
            }
        }
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
        for (ib, &scale) in scales.iter().enumerate() {
            let l = nearest_int(id * scale).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * ib..32 * ib + 32 {
                ls[j] = best_index_int8(&KVALUES_IQ4NL, idl * x[j]) as u8;
            }
            let l = (l + 32) as u8;
            if ib % 2 == 0 {
                scales_l[ib / 2] = l & 0xf;
            } else {
                scales_l[ib / 2] |= (l & 0xf) << 4;
            }
            scales_h |= u16::from(l >> 4) << (2 * ib);
        }
        let mut qs = [0u8; 128];
        pack_nibbles(&ls, &mut qs);
        Self {
            d: f16::from_f32(d),
            scales_h,
            scales_l,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_nearest_level_and_upper_on_ties() {
        let v = &KVALUES_IQ4NL;
        assert_eq!(best_index_int8(v, -200.0), 0);
        assert_eq!(best_index_int8(v, 200.0), 15);
        assert_eq!(best_index_int8(v, 0.0), 8); // 1 is nearer than -10
        assert_eq!(best_index_int8(v, 7.0), 9); // midpoint of 1 and 13 goes up
        assert_eq!(best_index_int8(v, 6.99), 8);
        assert_eq!(best_index_int8(v, -116.0), 0); // nearer -127 than -104
    }
}
