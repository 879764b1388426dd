//! Portable vec_dot kernels: one weight row against one activation row.
//!
//! Each function mirrors ggml's generic `ggml_vec_dot_<w>_<act>`: an exact integer dot
//! product per block (or sub-block), times the block scales, summed in f32. `n` is the number
//! of values; `w` holds `n / block_size` weight blocks and `a` the activation row in the
//! layout of [`crate::ActType`]. These are the reference the SIMD kernels are tested against.

use crate::act::{Q8_0_ACT_BYTES, Q8_1_ACT_BYTES};
use crate::dequant::{
    e8m0_half, f16_at, f32_at, q3k_scales, q5_values, q6k_values, scale_min_k4, KVALUES_IQ4NL,
    KVALUES_MXFP4,
};
use mlaserve_gguf::QK_K;

#[inline]
fn i8s(b: &[u8]) -> impl Iterator<Item = i32> + '_ {
    b.iter().map(|&v| v as i8 as i32)
}

/// `Σ w·a` for f32 weights and an f32 activation row (both as little-endian f32 bytes).
pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_lanes(w[..4 * n].chunks_exact(4).map(|b| f32_at(b, 0)), a)
}

/// F16 weights against an f32 row of f16-rounded activations (products are exact in f32).
pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_lanes(w[..2 * n].chunks_exact(2).map(|b| f16_at(b, 0)), a)
}

/// BF16 weights against an f32 row of bf16-rounded activations.
pub fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let wv = w[..2 * n]
        .chunks_exact(2)
        .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32());
    dot_lanes(wv, a)
}

/// f32 dot with 8 interleaved partial sums (the association the SIMD kernels use).
#[inline]
fn dot_lanes(w: impl Iterator<Item = f32>, a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (i, (wv, ab)) in w.zip(a.chunks_exact(4)).enumerate() {
        acc[i % 8] += wv * f32_at(ab, 0);
    }
    acc.iter().sum()
}

/// Q4_0 · Q8_0.
pub fn vec_dot_q4_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(18)
        .zip(a.chunks_exact(Q8_0_ACT_BYTES))
        .take(n / 32)
    {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += ((x[2 + j] & 0xF) as i32 - 8) * (y[4 + j] as i8 as i32);
            isum += ((x[2 + j] >> 4) as i32 - 8) * (y[20 + j] as i8 as i32);
        }
        sum += isum as f32 * f16_at(x, 0) * f32_at(y, 0);
    }
    sum
}

/// Q4_1 · Q8_1: `d_w·d_a·Σq·q8 + m_w·s_a`.
pub fn vec_dot_q4_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(20)
        .zip(a.chunks_exact(Q8_1_ACT_BYTES))
        .take(n / 32)
    {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (x[4 + j] & 0xF) as i32 * (y[8 + j] as i8 as i32);
            isum += (x[4 + j] >> 4) as i32 * (y[24 + j] as i8 as i32);
        }
        sum += isum as f32 * f16_at(x, 0) * f32_at(y, 0) + f16_at(x, 2) * f32_at(y, 4);
    }
    sum
}

/// Q5_0 · Q8_0.
pub fn vec_dot_q5_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(22)
        .zip(a.chunks_exact(Q8_0_ACT_BYTES))
        .take(n / 32)
    {
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        let q = q5_values(qh, &x[6..22]);
        let isum: i32 = q
            .iter()
            .zip(i8s(&y[4..36]))
            .map(|(&q, a)| (q as i32 - 16) * a)
            .sum();
        sum += isum as f32 * f16_at(x, 0) * f32_at(y, 0);
    }
    sum
}

/// Q5_1 · Q8_1.
pub fn vec_dot_q5_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(24)
        .zip(a.chunks_exact(Q8_1_ACT_BYTES))
        .take(n / 32)
    {
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        let q = q5_values(qh, &x[8..24]);
        let isum: i32 = q
            .iter()
            .zip(i8s(&y[8..40]))
            .map(|(&q, a)| q as i32 * a)
            .sum();
        sum += isum as f32 * f16_at(x, 0) * f32_at(y, 0) + f16_at(x, 2) * f32_at(y, 4);
    }
    sum
}

/// Q8_0 · Q8_0.
pub fn vec_dot_q8_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(34)
        .zip(a.chunks_exact(Q8_0_ACT_BYTES))
        .take(n / 32)
    {
        let isum: i32 = i8s(&x[2..34]).zip(i8s(&y[4..36])).map(|(p, q)| p * q).sum();
        sum += isum as f32 * f16_at(x, 0) * f32_at(y, 0);
    }
    sum
}

/// IQ4_NL · Q8_0.
pub fn vec_dot_iq4_nl_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(18)
        .zip(a.chunks_exact(Q8_0_ACT_BYTES))
        .take(n / 32)
    {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += KVALUES_IQ4NL[(x[2 + j] & 0xF) as usize] as i32 * (y[4 + j] as i8 as i32);
            isum += KVALUES_IQ4NL[(x[2 + j] >> 4) as usize] as i32 * (y[20 + j] as i8 as i32);
        }
        sum += isum as f32 * f16_at(x, 0) * f32_at(y, 0);
    }
    sum
}

/// MXFP4 · Q8_0 (code book doubled, scale halved, as ggml).
pub fn vec_dot_mxfp4_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(17)
        .zip(a.chunks_exact(Q8_0_ACT_BYTES))
        .take(n / 32)
    {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += KVALUES_MXFP4[(x[1 + j] & 0xF) as usize] as i32 * (y[4 + j] as i8 as i32);
            isum += KVALUES_MXFP4[(x[1 + j] >> 4) as usize] as i32 * (y[20 + j] as i8 as i32);
        }
        sum += isum as f32 * e8m0_half(x[0]) * f32_at(y, 0);
    }
    sum
}

/// The `(d, qs, bsums)` of a Q8_K activation block.
#[inline]
fn q8k(y: &[u8]) -> (f32, &[u8], [i32; 16]) {
    let mut bsums = [0i32; 16];
    for (j, b) in bsums.iter_mut().enumerate() {
        *b = i16::from_le_bytes([y[260 + 2 * j], y[261 + 2 * j]]) as i32;
    }
    (f32_at(y, 0), &y[4..260], bsums)
}

/// Q2_K · Q8_K: `d·Σ sc_j·Σ q·q8 − dmin·Σ m_j·bsum_j` over the 16 sub-blocks.
pub fn vec_dot_q2_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(84).zip(a.chunks_exact(292)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k(y);
        let (scales, qs) = (&x[0..16], &x[16..80]);
        let (mut isum, mut msum) = (0i32, 0i32);
        for (j, b) in bsums.iter().enumerate() {
            msum += (scales[j] >> 4) as i32 * b;
        }
        for half in 0..2 {
            for j in 0..4 {
                for k in 0..2 {
                    let sub = 8 * half + 2 * j + k;
                    let mut s = 0i32;
                    for l in 0..16 {
                        let q = ((qs[32 * half + 16 * k + l] >> (2 * j)) & 3) as i32;
                        s += q * (q8[16 * sub + l] as i8 as i32);
                    }
                    isum += (scales[sub] & 0xF) as i32 * s;
                }
            }
        }
        sum += yd * (f16_at(x, 80) * isum as f32 - f16_at(x, 82) * msum as f32);
    }
    sum
}

/// Q3_K · Q8_K.
pub fn vec_dot_q3_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(110).zip(a.chunks_exact(292)).take(n / QK_K) {
        let (yd, q8, _) = q8k(y);
        let (hmask, qs) = (&x[0..32], &x[32..96]);
        let scales = q3k_scales(&x[96..108]);
        let mut isum = 0i32;
        for half in 0..2 {
            for j in 0..4 {
                let m = 1u8 << (4 * half + j);
                for k in 0..2 {
                    let sub = 8 * half + 2 * j + k;
                    let mut s = 0i32;
                    for l in 0..16 {
                        let i = 16 * k + l;
                        let lo = ((qs[32 * half + i] >> (2 * j)) & 3) as i32;
                        let q = lo - if hmask[i] & m != 0 { 0 } else { 4 };
                        s += q * (q8[16 * sub + l] as i8 as i32);
                    }
                    isum += scales[sub] as i32 * s;
                }
            }
        }
        sum += yd * f16_at(x, 108) * isum as f32;
    }
    sum
}

/// Q4_K · Q8_K.
pub fn vec_dot_q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(292)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k(y);
        let (scales, qs) = (&x[4..16], &x[16..144]);
        let (mut isum, mut msum) = (0i32, 0i32);
        for c in 0..4 {
            let q = &qs[32 * c..32 * c + 32];
            let (s1, m1) = scale_min_k4(2 * c, scales);
            let (s2, m2) = scale_min_k4(2 * c + 1, scales);
            let lo: i32 = q
                .iter()
                .zip(i8s(&q8[64 * c..64 * c + 32]))
                .map(|(&q, a)| (q & 0xF) as i32 * a)
                .sum();
            let hi: i32 = q
                .iter()
                .zip(i8s(&q8[64 * c + 32..64 * c + 64]))
                .map(|(&q, a)| (q >> 4) as i32 * a)
                .sum();
            isum += s1 as i32 * lo + s2 as i32 * hi;
            msum += m1 as i32 * (bsums[4 * c] + bsums[4 * c + 1])
                + m2 as i32 * (bsums[4 * c + 2] + bsums[4 * c + 3]);
        }
        sum += yd * (f16_at(x, 0) * isum as f32 - f16_at(x, 2) * msum as f32);
    }
    sum
}

/// Q5_K · Q8_K.
pub fn vec_dot_q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(176).zip(a.chunks_exact(292)).take(n / QK_K) {
        let (yd, q8, bsums) = q8k(y);
        let (scales, qh, qs) = (&x[4..16], &x[16..48], &x[48..176]);
        let (mut isum, mut msum) = (0i32, 0i32);
        for c in 0..4 {
            let q = &qs[32 * c..32 * c + 32];
            let (s1, m1) = scale_min_k4(2 * c, scales);
            let (s2, m2) = scale_min_k4(2 * c + 1, scales);
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let h1 = ((qh[l] >> (2 * c)) & 1) as i32 * 16;
                let h2 = ((qh[l] >> (2 * c + 1)) & 1) as i32 * 16;
                lo += ((q[l] & 0xF) as i32 + h1) * (q8[64 * c + l] as i8 as i32);
                hi += ((q[l] >> 4) as i32 + h2) * (q8[64 * c + 32 + l] as i8 as i32);
            }
            isum += s1 as i32 * lo + s2 as i32 * hi;
            msum += m1 as i32 * (bsums[4 * c] + bsums[4 * c + 1])
                + m2 as i32 * (bsums[4 * c + 2] + bsums[4 * c + 3]);
        }
        sum += yd * (f16_at(x, 0) * isum as f32 - f16_at(x, 2) * msum as f32);
    }
    sum
}

/// Q6_K · Q8_K.
pub fn vec_dot_q6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(292)).take(n / QK_K) {
        let (yd, q8, _) = q8k(y);
        let q = q6k_values(&x[0..128], &x[128..192]);
        let mut isum = 0i32;
        for sub in 0..16 {
            let s: i32 = q[16 * sub..16 * sub + 16]
                .iter()
                .zip(i8s(&q8[16 * sub..16 * sub + 16]))
                .map(|(&q, a)| q as i32 * a)
                .sum();
            isum += (x[192 + sub] as i8 as i32) * s;
        }
        sum += yd * f16_at(x, 208) * isum as f32;
    }
    sum
}

/// Q8_K · Q8_K (Q8_K weights are rare; ggml has no kernel for them).
pub fn vec_dot_q8_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(292).zip(a.chunks_exact(292)).take(n / QK_K) {
        let isum: i32 = i8s(&x[4..260])
            .zip(i8s(&y[4..260]))
            .map(|(p, q)| p * q)
            .sum();
        sum += f32_at(x, 0) * f32_at(y, 0) * isum as f32;
    }
    sum
}

/// IQ4_XS · Q8_K.
pub fn vec_dot_iq4_xs_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.chunks_exact(136).zip(a.chunks_exact(292)).take(n / QK_K) {
        let (yd, q8, _) = q8k(y);
        let scales_h = u16::from_le_bytes([x[2], x[3]]);
        let mut isum = 0i32;
        for ib in 0..8 {
            let ls = ((x[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32
                | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
            let qs = &x[8 + 16 * ib..24 + 16 * ib];
            let y8 = &q8[32 * ib..32 * ib + 32];
            let mut s = 0i32;
            for j in 0..16 {
                s += KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32 * (y8[j] as i8 as i32);
                s += KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32 * (y8[j + 16] as i8 as i32);
            }
            isum += (ls - 32) * s;
        }
        sum += yd * f16_at(x, 0) * isum as f32;
    }
    sum
}
