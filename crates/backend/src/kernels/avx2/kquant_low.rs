//! Q2_K and Q3_K against Q8_K activations.
//!
//! Both have 16 sub-blocks of 16 values, the granularity of the activation's `bsums`, so the
//! offsets (Q2_K's mins, Q3_K's `-4` for a clear high bit) cost one `madd` per token and
//! super-block: `Σ sc·Σ (u − o)·q8 = Σ sc·Σ u·q8 − Σ (o·sc)·bsum`. The unsigned parts `u`
//! (0..=3, or 0..=7 with Q3_K's high bit) go straight into `maddubs`.

use super::row_kernel;
use super::util::{f16_at, f32_at, hsum_ps};
use crate::dequant::q3k_scales;
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// `[s[idx] x 8 | s[idx + 1] x 8]` widened to 16 i16 lanes (signed bytes).
#[inline(always)]
unsafe fn pair_scale(s8: __m128i, idx: i64) -> __m256i {
    let mask = _mm_set_epi64x(
        (idx + 1) * 0x0101_0101_0101_0101,
        idx * 0x0101_0101_0101_0101,
    );
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, mask))
}

/// Q2_K: scales[16] (low nibble scale, high nibble min) | qs[64] | d f16 | dmin f16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut accm = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x = w.add(ib * 84);
        let (d, dmin) = (f16_at(x.add(80)), f16_at(x.add(82)));
        let raw = _mm_loadu_si128(x as *const __m128i);
        let sc8 = _mm_and_si128(raw, m4);
        let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
        let mut sumi = [_mm256_setzero_si256(); NT];
        for (t, am) in accm.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8K_BYTES);
            let bs = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
            let md = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, bs));
            *am = _mm256_fmadd_ps(_mm256_set1_ps(dmin * f32_at(y)), md, *am);
        }
        for h in 0..2 {
            let q = _mm256_loadu_si256(x.add(16 + 32 * h) as *const __m256i);
            for j in 0..4 {
                let q2 = match j {
                    0 => _mm256_and_si256(q, m3),
                    1 => _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
                    2 => _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
                    _ => _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
                };
                let scale = pair_scale(sc8, (8 * h + 2 * j) as i64);
                for (t, s) in sumi.iter_mut().enumerate() {
                    let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 128 * h + 32 * j);
                    let q8 = _mm256_loadu_si256(y as *const __m256i);
                    *s = _mm256_add_epi32(
                        *s,
                        _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q2, q8)),
                    );
                }
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let yd = f32_at(a.add(t * stride + ib * Q8K_BYTES));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(sumi[t]), *acc);
        }
    }
    for t in 0..NT {
        *out.add(t) = hsum_ps(acc[t]) - hsum_ps(accm[t]);
    }
}

/// Q3_K: hmask[32] | qs[64] | scales[12] (16 six-bit scales) | d f16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_nt<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x = w.add(ib * 110);
        let d = f16_at(x.add(108));
        let scales = q3k_scales(std::slice::from_raw_parts(x.add(96), 12));
        let sc8 = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
        // The `-4` of every value, folded with the scales: 4·sc per sub-block.
        let off16 = _mm256_slli_epi16::<2>(_mm256_cvtepi8_epi16(sc8));
        let hm = _mm256_loadu_si256(x as *const __m256i);
        let mut sumi = [_mm256_setzero_si256(); NT];
        for (t, s) in sumi.iter_mut().enumerate() {
            let bs = _mm256_loadu_si256(
                a.add(t * stride + ib * Q8K_BYTES + Q8K_BSUMS) as *const __m256i
            );
            *s = _mm256_sub_epi32(*s, _mm256_madd_epi16(off16, bs));
        }
        for h in 0..2 {
            let q = _mm256_loadu_si256(x.add(32 + 32 * h) as *const __m256i);
            for j in 0..4 {
                let q2 = match j {
                    0 => _mm256_and_si256(q, m3),
                    1 => _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
                    2 => _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
                    _ => _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
                };
                let bit = _mm256_set1_epi8((1u8 << (4 * h + j)) as i8);
                let high =
                    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                let u = _mm256_or_si256(q2, high);
                let scale = pair_scale(sc8, (8 * h + 2 * j) as i64);
                for (t, s) in sumi.iter_mut().enumerate() {
                    let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 128 * h + 32 * j);
                    let q8 = _mm256_loadu_si256(y as *const __m256i);
                    *s =
                        _mm256_add_epi32(*s, _mm256_madd_epi16(scale, _mm256_maddubs_epi16(u, q8)));
                }
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let yd = f32_at(a.add(t * stride + ib * Q8K_BYTES));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(sumi[t]), *acc);
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        *out.add(t) = hsum_ps(*acc);
    }
}

row_kernel!(q2_k_rows, q2_k_nt, 256, 84, Q8K_BYTES);
row_kernel!(q3_k_rows, q3_k_nt, 256, 110, Q8K_BYTES);
