//! Quantized weight rows against unrounded f32 activations (`QMatrix::with_f32_activations`)
//! for a few tokens: each block's weights are dequantized in registers — the same f32 values
//! as `dequantize` writes (one product, or Q4_K's product then difference) — and meet the
//! activations by FMA. No buffer between: for decode, where a row meets at most 4 tokens and
//! a dequantized tile would be written and read back for one use.

use super::kquant::k4_scales_mins;
use super::q8::{block_bytes, lut, q8_block, Q4_0, Q5_0, Q8_0};
use super::row_kernel;
use super::util::{f16x2_at, hsum_ps, i8_lanes, u8_lanes};
use std::arch::x86_64::*;

/// 32-value blocks with one f16 scale: `w = d · q`, q signed.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32_nt<const NT: usize, const KIND: u8>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let (bb, lut) = (block_bytes(KIND), lut(KIND));
    let mut acc = [[_mm256_setzero_ps(); 2]; NT];
    for ib in 0..nb {
        let (d, q) = q8_block::<KIND>(w.add(ib * bb), lut);
        for k in 0..4 {
            let wk = _mm256_mul_ps(d, i8_lanes(q, k));
            for (t, acc) in acc.iter_mut().enumerate() {
                let ap = (a.add(t * stride) as *const f32).add(32 * ib + 8 * k);
                acc[k % 2] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(ap), acc[k % 2]);
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        *out.add(t) = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    }
}

/// Q4_K: `w = (d · sc) · q − dmin · m` per 32-value sub-block. The 8 sub-blocks' `d · sc`
/// and `dmin · m` are formed in one vector each (the same f32 products as one at a time).
/// `(d · sc) · q` is exact in f32 (11 + 6 + 4 significant bits), so one `fmsub` rounds the
/// difference once, as `dequantize`'s product then subtraction does.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_exact_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let lanes = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(v));
    let mut acc = [[_mm256_setzero_ps(); 2]; NT];
    for ib in 0..nb {
        let x = w.add(ib * 144);
        let dm = f16x2_at(x);
        let sm = k4_scales_mins(x.add(4));
        let dl_all = _mm256_mul_ps(_mm256_broadcastss_ps(dm), lanes(_mm256_castsi256_si128(sm)));
        let ml_all = _mm256_mul_ps(
            _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
            lanes(_mm256_extracti128_si256::<1>(sm)),
        );
        for c in 0..4 {
            let bits = _mm256_loadu_si256(x.add(16 + 32 * c) as *const __m256i);
            for (sub, q) in [
                _mm256_and_si256(bits, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
            ]
            .into_iter()
            .enumerate()
            {
                let j = _mm256_set1_epi32((2 * c + sub) as i32);
                let dl = _mm256_permutevar8x32_ps(dl_all, j);
                let ml = _mm256_permutevar8x32_ps(ml_all, j);
                let base = 256 * ib + 64 * c + 32 * sub;
                for k in 0..4 {
                    let wk = _mm256_fmsub_ps(dl, u8_lanes(q, k), ml);
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let ap = (a.add(t * stride) as *const f32).add(base + 8 * k);
                        acc[k % 2] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(ap), acc[k % 2]);
                    }
                }
            }
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        *out.add(t) = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_exact_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: *mut f32,
) {
    q32_nt::<NT, Q8_0>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_exact_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: *mut f32,
) {
    q32_nt::<NT, Q4_0>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_exact_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    s: usize,
    o: *mut f32,
) {
    q32_nt::<NT, Q5_0>(nb, w, a, s, o)
}

row_kernel!(q8_0_exact_rows, q8_0_exact_nt, 32, 34, 128);
row_kernel!(q4_0_exact_rows, q4_0_exact_nt, 32, 18, 128);
row_kernel!(q5_0_exact_rows, q5_0_exact_nt, 32, 22, 128);
row_kernel!(q4_k_exact_rows, q4_k_exact_nt, 256, 144, 1024);
