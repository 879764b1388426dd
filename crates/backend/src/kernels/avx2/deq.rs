//! Weight blocks to f32, bit for bit the scalar `dequantize_row_unchecked`: the same f32
//! products (and, for Q4_K, the same product then difference, no FMA) lane by lane. For the
//! products that multiply a dequantized tile against f32 activations
//! (`QMatrix::with_f32_activations`).

use super::q8::{block_bytes, lut, q8_block, IQ4_NL, Q4_0, Q5_0, Q8_0};
use super::util::{f16_at, i8_lanes, u8_lanes};
use crate::dequant::scale_min_k4;
use mlaserve_gguf::GgmlType;
use std::arch::x86_64::*;

/// The `nb` blocks of `KIND` at `x` as `d · q` to `y`.
#[inline(always)]
unsafe fn q8_blocks<const KIND: u8>(nb: usize, x: *const u8, y: *mut f32) {
    let (bb, lut) = (block_bytes(KIND), lut(KIND));
    for i in 0..nb {
        let (d, q) = q8_block::<KIND>(x.add(i * bb), lut);
        for k in 0..4 {
            _mm256_storeu_ps(y.add(32 * i + 8 * k), _mm256_mul_ps(d, i8_lanes(q, k)));
        }
    }
}

/// 32 unsigned bytes `q` as `d · q − m`, to `y[0..32]`.
#[inline(always)]
unsafe fn store_32_min(q: __m256i, d: __m256, m: __m256, y: *mut f32) {
    for k in 0..4 {
        _mm256_storeu_ps(
            y.add(8 * k),
            _mm256_sub_ps(_mm256_mul_ps(d, u8_lanes(q, k)), m),
        );
    }
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
        GgmlType::Q8_0 => q8_blocks::<Q8_0>(nb, x, y),
        GgmlType::Q4_0 => q8_blocks::<Q4_0>(nb, x, y),
        GgmlType::Q5_0 => q8_blocks::<Q5_0>(nb, x, y),
        GgmlType::IQ4_NL => q8_blocks::<IQ4_NL>(nb, x, y),
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
