//! Quantized weight rows against unrounded f32 activations (`QMatrix::with_f32_activations`)
//! for a few tokens: each block's weights are dequantized in registers — the same f32 values
//! as `dequantize` writes (one product, or Q4_K's product then difference) — and meet the
//! activations by FMA. No buffer between: for decode, where a row meets at most 4 tokens and
//! a dequantized tile would be written and read back for one use.

use super::q8::bits_32;
use super::row_kernel;
use super::util::{f16_at, f16x8_at, hsum_ps, nibbles_32};
use crate::dequant::scale_min_k4;
use std::arch::x86_64::*;

const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q5_0: u8 = 2;

/// Lanes `8k..8k+8` of 32 signed bytes as f32 (k in 0..4).
#[inline(always)]
unsafe fn i8_lanes(q: __m256i, k: usize) -> __m256 {
    let half = if k < 2 {
        _mm256_castsi256_si128(q)
    } else {
        _mm256_extracti128_si256::<1>(q)
    };
    let v = if k & 1 == 0 {
        half
    } else {
        _mm_srli_si128::<8>(half)
    };
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// Lanes `8k..8k+8` of 32 unsigned bytes as f32 (k in 0..4).
#[inline(always)]
unsafe fn u8_lanes(q: __m256i, k: usize) -> __m256 {
    let half = if k < 2 {
        _mm256_castsi256_si128(q)
    } else {
        _mm256_extracti128_si256::<1>(q)
    };
    let v = if k & 1 == 0 {
        half
    } else {
        _mm_srli_si128::<8>(half)
    };
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

/// 32-value blocks with one f16 scale: `w = d · q`, q signed.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q32_nt<const NT: usize, const KIND: u8>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let bb = match KIND {
        Q8_0 => 34,
        Q4_0 => 18,
        _ => 22,
    };
    let mut acc = [[_mm256_setzero_ps(); 2]; NT];
    for ib in 0..nb {
        let x = w.add(ib * bb);
        let d = f16x8_at(x);
        let q = match KIND {
            Q8_0 => _mm256_loadu_si256(x.add(2) as *const __m256i),
            Q4_0 => _mm256_sub_epi8(nibbles_32(x.add(2)), _mm256_set1_epi8(8)),
            _ => {
                let hi = _mm256_and_si256(bits_32(x.add(2)), _mm256_set1_epi8(0x10));
                _mm256_sub_epi8(
                    _mm256_or_si256(nibbles_32(x.add(6)), hi),
                    _mm256_set1_epi8(16),
                )
            }
        };
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

/// Q4_K: `w = (d · sc) · q − dmin · m` per 32-value sub-block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_exact_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); 2]; NT];
    for ib in 0..nb {
        let x = w.add(ib * 144);
        let (d, dmin) = (f16_at(x), f16_at(x.add(2)));
        let scales = std::slice::from_raw_parts(x.add(4), 12);
        for c in 0..4 {
            let bits = _mm256_loadu_si256(x.add(16 + 32 * c) as *const __m256i);
            for (sub, q) in [
                _mm256_and_si256(bits, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
            ]
            .into_iter()
            .enumerate()
            {
                let (s, m) = scale_min_k4(2 * c + sub, scales);
                let (dl, ml) = (
                    _mm256_set1_ps(d * s as f32),
                    _mm256_set1_ps(dmin * m as f32),
                );
                let base = 256 * ib + 64 * c + 32 * sub;
                for k in 0..4 {
                    let wk = _mm256_sub_ps(_mm256_mul_ps(dl, u8_lanes(q, k)), ml);
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
