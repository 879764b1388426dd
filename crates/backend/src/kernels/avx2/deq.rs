//! Weight blocks to f32, bit for bit the scalar `dequantize_row_unchecked`: the same f32
//! products (and, for Q4_K, the same product then difference, no FMA) lane by lane. For the
//! products that multiply a dequantized tile against f32 activations
//! (`QMatrix::with_f32_activations`).

use super::q8::bits_32;
use super::util::{f16_at, f16x8_at, nibbles_32};
use crate::dequant::scale_min_k4;
use mlaserve_gguf::GgmlType;
use std::arch::x86_64::*;

/// 8 i8 lanes at the low half of `v` (bytes `8k..8k+8` when shifted there) as f32.
#[inline(always)]
unsafe fn i8x8_ps(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// 32 signed bytes times `d`, to `y[0..32]`.
#[inline(always)]
unsafe fn store_32(q: __m256i, d: __m256, y: *mut f32) {
    let lo = _mm256_castsi256_si128(q);
    let hi = _mm256_extracti128_si256::<1>(q);
    _mm256_storeu_ps(y, _mm256_mul_ps(d, i8x8_ps(lo)));
    _mm256_storeu_ps(y.add(8), _mm256_mul_ps(d, i8x8_ps(_mm_srli_si128::<8>(lo))));
    _mm256_storeu_ps(y.add(16), _mm256_mul_ps(d, i8x8_ps(hi)));
    _mm256_storeu_ps(
        y.add(24),
        _mm256_mul_ps(d, i8x8_ps(_mm_srli_si128::<8>(hi))),
    );
}

/// 32 unsigned bytes `q` as `d · q − m`, to `y[0..32]`.
#[inline(always)]
unsafe fn store_32_min(q: __m256i, d: __m256, m: __m256, y: *mut f32) {
    let lo = _mm256_castsi256_si128(q);
    let hi = _mm256_extracti128_si256::<1>(q);
    let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d, f(lo)), m));
    _mm256_storeu_ps(
        y.add(8),
        _mm256_sub_ps(_mm256_mul_ps(d, f(_mm_srli_si128::<8>(lo))), m),
    );
    _mm256_storeu_ps(y.add(16), _mm256_sub_ps(_mm256_mul_ps(d, f(hi)), m));
    _mm256_storeu_ps(
        y.add(24),
        _mm256_sub_ps(_mm256_mul_ps(d, f(_mm_srli_si128::<8>(hi))), m),
    );
}

/// Dequantize the whole blocks of `src` (type `ty`) into `out`; `false` (nothing written)
/// where this level has no conversion for `ty`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `src` holds `out.len() / block_size` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> bool {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let nb = out.len() / bs;
    debug_assert!(src.len() >= nb * ts);
    let (x, y) = (src.as_ptr(), out.as_mut_ptr());
    match ty {
        GgmlType::Q8_0 => {
            for i in 0..nb {
                let b = x.add(i * ts);
                store_32(
                    _mm256_loadu_si256(b.add(2) as *const __m256i),
                    f16x8_at(b),
                    y.add(32 * i),
                );
            }
        }
        GgmlType::Q4_0 => {
            for i in 0..nb {
                let b = x.add(i * ts);
                let q = _mm256_sub_epi8(nibbles_32(b.add(2)), _mm256_set1_epi8(8));
                store_32(q, f16x8_at(b), y.add(32 * i));
            }
        }
        GgmlType::Q5_0 => {
            for i in 0..nb {
                let b = x.add(i * ts);
                // Bit 4 from qh, then − 16.
                let hi = _mm256_and_si256(bits_32(b.add(2)), _mm256_set1_epi8(0x10));
                let q = _mm256_sub_epi8(
                    _mm256_or_si256(nibbles_32(b.add(6)), hi),
                    _mm256_set1_epi8(16),
                );
                store_32(q, f16x8_at(b), y.add(32 * i));
            }
        }
        GgmlType::Q4_K => {
            let m4 = _mm256_set1_epi8(0x0F);
            for i in 0..nb {
                let b = x.add(i * ts);
                let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
                let scales = std::slice::from_raw_parts(b.add(4), 12);
                for c in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * c, scales);
                    let (s2, m2) = scale_min_k4(2 * c + 1, scales);
                    let bits = _mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i);
                    let yc = y.add(256 * i + 64 * c);
                    store_32_min(
                        _mm256_and_si256(bits, m4),
                        _mm256_set1_ps(d * s1 as f32),
                        _mm256_set1_ps(dmin * m1 as f32),
                        yc,
                    );
                    store_32_min(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                        _mm256_set1_ps(d * s2 as f32),
                        _mm256_set1_ps(dmin * m2 as f32),
                        yc.add(32),
                    );
                }
            }
        }
        GgmlType::F16 => {
            for i in (0..nb).step_by(8) {
                if i + 8 <= nb {
                    let h = _mm_loadu_si128(x.add(2 * i) as *const __m128i);
                    _mm256_storeu_ps(y.add(i), _mm256_cvtph_ps(h));
                } else {
                    for k in i..nb {
                        *y.add(k) = f16_at(x.add(2 * k));
                    }
                }
            }
        }
        GgmlType::BF16 => {
            for i in (0..nb).step_by(8) {
                if i + 8 <= nb {
                    let h = _mm_loadu_si128(x.add(2 * i) as *const __m128i);
                    let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
                    _mm256_storeu_ps(y.add(i), _mm256_castsi256_ps(w));
                } else {
                    for k in i..nb {
                        let bits = (x.add(2 * k) as *const u16).read_unaligned();
                        *y.add(k) = f32::from_bits((bits as u32) << 16);
                    }
                }
            }
        }
        _ => return false,
    }
    true
}
