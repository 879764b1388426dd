//! Scalar dequantization of ggml blocks, straight from the block layouts of ggml-common.h.
//!
//! These are the reference the kernels are written against: obviously right, not fast.
//! Invariant of every `dequantize_*` here: `src` holds exactly `out.len() / block_size` blocks.

use crate::error::BackendError;
use mlaserve_gguf::{GgmlType, QK_K};

/// The IQ4_NL / IQ4_XS non-linear 4-bit code book.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4 (e2m1) values times 2; the block scale is halved to compensate.
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// `2^(e - 128)`: half the E8M0 scale, as ggml's `GGML_E8M0_TO_FP32_HALF`.
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits: u32 = if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Scale and min (6 bits each) of sub-block `j` (0..8) of a Q4_K/Q5_K block.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (already minus 32).
#[inline]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let tmp = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = ((aux[i / 4] >> (8 * (i % 4))) & 0xFF) as i8 - 32;
    }
    out
}

/// Whether this crate can dequantize (and so multiply by) a type.
pub(crate) fn is_supported(ty: GgmlType) -> bool {
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

/// Dequantize one row of `out.len()` elements stored as `ty` in `src`.
///
/// Errors if the type is unsupported, `out.len()` is not a whole number of blocks, or `src`
/// has the wrong length.
pub fn dequantize_row_bytes(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), BackendError> {
    if !is_supported(ty) {
        return Err(BackendError::UnsupportedType(ty));
    }
    let bs = ty.block_size();
    if !out.len().is_multiple_of(bs) {
        return Err(BackendError::ColsNotBlockMultiple {
            ty,
            cols: out.len(),
            block: bs,
        });
    }
    let expected = out.len() / bs * ty.type_size();
    if src.len() != expected {
        return Err(BackendError::SizeMismatch {
            ty,
            rows: 1,
            cols: out.len(),
            expected,
            got: src.len(),
        });
    }
    dequantize_row_unchecked(ty, src, out);
    Ok(())
}

/// As [`dequantize_row_bytes`] for a type and sizes the caller has validated.
pub(crate) fn dequantize_row_unchecked(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    use GgmlType::*;
    let ts = ty.type_size();
    let bs = ty.block_size();
    for (b, y) in src.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
        match ty {
            F32 => y[0] = f32_at(b, 0),
            F16 => y[0] = f16_at(b, 0),
            BF16 => y[0] = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            Q4_0 => block_q4_0(b, y),
            Q4_1 => block_q4_1(b, y),
            Q5_0 => block_q5_0(b, y),
            Q5_1 => block_q5_1(b, y),
            Q8_0 => {
                let d = f16_at(b, 0);
                for (j, v) in y.iter_mut().enumerate() {
                    *v = d * (b[2 + j] as i8) as f32;
                }
            }
            Q2_K => block_q2_k(b, y),
            Q3_K => block_q3_k(b, y),
            Q4_K => block_q4_k(b, y),
            Q5_K => block_q5_k(b, y),
            Q6_K => block_q6_k(b, y),
            Q8_K => {
                let d = f32_at(b, 0);
                for (j, v) in y.iter_mut().enumerate() {
                    *v = d * (b[4 + j] as i8) as f32;
                }
            }
            IQ4_NL => {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0xF) as usize] as f32;
                    y[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
                }
            }
            IQ4_XS => block_iq4_xs(b, y),
            MXFP4 => {
                let d = e8m0_half(b[0]);
                for j in 0..16 {
                    y[j] = d * KVALUES_MXFP4[(b[1 + j] & 0xF) as usize] as f32;
                    y[j + 16] = d * KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32;
                }
            }
            other => unreachable!("dequantize_row_unchecked called with unsupported {other}"),
        }
    }
}

fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        y[j] = d * ((b[2 + j] & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
    }
}

fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        y[j] = d * (b[4 + j] & 0xF) as f32 + m;
        y[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
    }
}

/// The 5-bit values (0..32) of a Q5_0/Q5_1 block: `qh` holds bit 4 of every element.
#[inline]
pub(crate) fn q5_values(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        v[j] = (qs[j] & 0xF) | h0 as u8;
        v[j + 16] = (qs[j] >> 4) | h1 as u8;
    }
    v
}

fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (o, q) in y.iter_mut().zip(q5_values(qh, &b[6..22])) {
        *o = d * (q as i32 - 16) as f32;
    }
}

fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (o, q) in y.iter_mut().zip(q5_values(qh, &b[8..24])) {
        *o = d * q as f32 + m;
    }
}

// Q2_K: scales[16] | qs[64] | d f16 | dmin f16
fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for k in 0..2 {
                let sc = scales[8 * half + 2 * j + k];
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                for l in 0..16 {
                    let v = (q[16 * k + l] >> shift) & 3;
                    y[128 * half + 32 * j + 16 * k + l] = dl * v as f32 - ml;
                }
            }
        }
    }
}

// Q3_K: hmask[32] | qs[64] | scales[12] | d f16
fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            let shift = 2 * j;
            let m = 1u8 << (4 * half + j);
            for k in 0..2 {
                let dl = d * scales[8 * half + 2 * j + k] as f32;
                for l in 0..16 {
                    let i = 16 * k + l;
                    let lo = ((q[i] >> shift) & 3) as i32;
                    let v = lo - if hmask[i] & m != 0 { 0 } else { 4 };
                    y[128 * half + 32 * j + i] = dl * v as f32;
                }
            }
        }
    }
}

// Q4_K: d f16 | dmin f16 | scales[12] | qs[128]
fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, mm1, d2, mm2) = (
            d * s1 as f32,
            dmin * m1 as f32,
            d * s2 as f32,
            dmin * m2 as f32,
        );
        for l in 0..32 {
            y[64 * c + l] = d1 * (q[l] & 0xF) as f32 - mm1;
            y[64 * c + 32 + l] = d2 * (q[l] >> 4) as f32 - mm2;
        }
    }
}

// Q5_K: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, mm1, d2, mm2) = (
            d * s1 as f32,
            dmin * m1 as f32,
            d * s2 as f32,
            dmin * m2 as f32,
        );
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * c + l] = d1 * ((q[l] & 0xF) + h1) as f32 - mm1;
            y[64 * c + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - mm2;
        }
    }
}

/// The signed 6-bit values (-32..32) of a Q6_K block, in element order.
#[inline]
pub(crate) fn q6k_values(ql: &[u8], qh: &[u8]) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (
            &ql[64 * half..64 * half + 64],
            &qh[32 * half..32 * half + 32],
        );
        let y = &mut v[128 * half..128 * half + 128];
        for l in 0..32 {
            y[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

// Q6_K: ql[128] | qh[64] | scales[16] i8 | d f16
fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    let q = q6k_values(&b[0..128], &b[128..192]);
    for (i, (o, v)) in y.iter_mut().zip(q).enumerate() {
        *o = d * (b[192 + i / 16] as i8) as f32 * v as f32;
    }
}

// IQ4_XS: d f16 | scales_h u16 | scales_l[4] | qs[128]
fn block_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    for ib in 0..8 {
        let ls =
            ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
        let dl = d * (ls as i32 - 32) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        for j in 0..16 {
            y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
            y[32 * ib + j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}
