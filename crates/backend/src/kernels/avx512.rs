//! AVX-512 (F + BW) kernels for the hottest K-quants: Q4_K and Q5_K against Q8_K.
//!
//! Same structure as the AVX2 `k4` kernel (`NT <= 4` tokens; here two weight rows at a time,
//! sharing each activation load, each row's arithmetic that of a row alone), but one 512-bit
//! register holds a whole 64-value chunk: the 32 packed bytes are broadcast to both halves,
//! the upper half shifted right by 4, so lanes `0..64` hold values `64j..64j+64` in order and
//! meet one contiguous 64-byte activation load. That halves the `maddubs`/`madd` count per
//! value. Integer sums are the same as the scalar kernel's; only the f32 order differs.
//!
//! Safety invariant: only reached through [`crate::kernels::row_kernel`] with
//! [`crate::Isa::Avx512`], which `matmul_with` uses only after run-time detection.

use super::avx2::util::{f16_at, f32_at, hsum_ps, hsum_ps128};
use crate::kernels::RowKernel;
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// Q4_K/Q5_K 6-bit scales (bytes 0..8) and mins (bytes 8..16), unpacked as ggml does.
#[inline(always)]
unsafe fn k4_scales_mins(p: *const u8) -> __m128i {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u = p as *const u32;
    let (u0, u1, u2) = (
        u.read_unaligned(),
        u.add(1).read_unaligned(),
        u.add(2).read_unaligned(),
    );
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let s_lo = u0 & KMASK1;
    _mm_set_epi32(m_hi as i32, m_lo as i32, s_hi as i32, s_lo as i32)
}

/// `R` weight rows (at `w[r]`) against `NT` tokens: per row the arithmetic of one row alone;
/// the rows share each activation load.
#[allow(clippy::needless_range_loop)] // r and t index several arrays alike
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn k4_nt<const R: usize, const NT: usize, const HIGH: bool>(
    nb: usize,
    w: [*const u8; R],
    a: *const u8,
    stride: usize,
    out: [*mut f32; R],
) {
    let bb = if HIGH { 176 } else { 144 };
    let qs_off = if HIGH { 48 } else { 16 };
    let m4 = _mm512_set1_epi8(0x0F);
    // Shift the upper 256 bits by 4: the high nibbles become the second 32 values.
    let shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
    let mut acc = [[_mm512_setzero_ps(); NT]; R];
    let mut accm = [[_mm_setzero_ps(); NT]; R];
    for ib in 0..nb {
        let x: [*const u8; R] = std::array::from_fn(|r| w[r].add(ib * bb));
        let mut scales = [_mm512_setzero_si512(); R];
        let mut hbits = [_mm512_setzero_si512(); R];
        let mut dd = [0f32; R];
        for r in 0..R {
            let (d, dmin) = (f16_at(x[r]), f16_at(x[r].add(2)));
            dd[r] = d;
            let sm = k4_scales_mins(x[r].add(4));
            let sm16 = _mm256_cvtepu8_epi16(sm); // lanes 0..8 scales, 8..16 mins
            let mins = _mm256_extracti128_si256::<1>(sm16);
            scales[r] = _mm512_castsi256_si512(sm16);
            if HIGH {
                hbits[r] =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(x[r].add(16) as *const __m256i));
            }
            for (t, am) in accm[r].iter_mut().enumerate() {
                let y = a.add(t * stride + ib * Q8K_BYTES);
                let bs = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
                let pairs = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bs),
                    _mm256_extracti128_si256::<1>(bs),
                );
                let md = _mm_cvtepi32_ps(_mm_madd_epi16(mins, pairs));
                *am = _mm_fmadd_ps(_mm_set1_ps(dmin * f32_at(y)), md, *am);
            }
        }
        let mut sumi = [[_mm512_setzero_si512(); NT]; R];
        for j in 0..4 {
            let idx = _mm512_inserti64x4::<1>(
                _mm512_set1_epi16(2 * j as i16),
                _mm256_set1_epi16(2 * j as i16 + 1),
            );
            let mut q = [_mm512_setzero_si512(); R];
            let mut scale = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let packed = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    x[r].add(qs_off + 32 * j) as *const __m256i
                ));
                q[r] = _mm512_and_si512(_mm512_srlv_epi16(packed, shift), m4);
                if HIGH {
                    let bits = _mm512_inserti64x4::<1>(
                        _mm512_set1_epi8((1u8 << (2 * j)) as i8),
                        _mm256_set1_epi8((2u8 << (2 * j)) as i8),
                    );
                    let k = _mm512_test_epi8_mask(hbits[r], bits);
                    q[r] = _mm512_mask_add_epi8(q[r], k, q[r], _mm512_set1_epi8(16));
                }
                scale[r] = _mm512_permutexvar_epi16(idx, scales[r]);
            }
            for t in 0..NT {
                let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 64 * j);
                let q8 = _mm512_loadu_si512(y as *const __m512i);
                for r in 0..R {
                    let p = _mm512_madd_epi16(scale[r], _mm512_maddubs_epi16(q[r], q8));
                    sumi[r][t] = _mm512_add_epi32(sumi[r][t], p);
                }
            }
        }
        for r in 0..R {
            for (t, acc) in acc[r].iter_mut().enumerate() {
                let yd = f32_at(a.add(t * stride + ib * Q8K_BYTES));
                *acc = _mm512_fmadd_ps(
                    _mm512_set1_ps(dd[r] * yd),
                    _mm512_cvtepi32_ps(sumi[r][t]),
                    *acc,
                );
            }
        }
    }
    for r in 0..R {
        for t in 0..NT {
            let v = acc[r][t];
            // The upper 8 lanes through the f64 view: `extractf32x8` is AVX-512DQ, which this
            // function does not enable (it was an out-of-line call a row).
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let s = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
            *out[r].add(t) = hsum_ps(s) - hsum_ps128(accm[r][t]);
        }
    }
}

/// Rows in pairs (an odd last one alone), tokens in groups of 4, 2, 1.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn k4_rows<const HIGH: bool>(
    nb: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    stride: usize,
    nt: usize,
    out: *mut f32,
) {
    let mut r = 0;
    while r < rows {
        let pair = r + 1 < rows;
        let (w0, o0) = (w.add(r * row_bytes), out.add(r * nt));
        // Row r + 1's pointers are only followed when it exists (`pair`).
        let (w1, o1) = (
            w.wrapping_add((r + 1) * row_bytes),
            out.wrapping_add((r + 1) * nt),
        );
        let mut t = 0;
        while t < nt {
            let g = if nt - t >= 4 {
                4
            } else if nt - t >= 2 {
                2
            } else {
                1
            };
            let at = a.add(t * stride);
            let (p0, p1) = (o0.add(t), o1.wrapping_add(t));
            // Pairs for 4 tokens only: with 1-2 tokens (decode) the pair ran 22% slower
            // (Q4_K_M tg128 94 against 122 tok/s), 4 tokens (prefill) 3-4% faster.
            match (g, pair) {
                (4, true) => k4_nt::<2, 4, HIGH>(nb, [w0, w1], at, stride, [p0, p1]),
                (4, false) => k4_nt::<1, 4, HIGH>(nb, [w0], at, stride, [p0]),
                (2, _) => {
                    k4_nt::<1, 2, HIGH>(nb, [w0], at, stride, [p0]);
                    if pair {
                        k4_nt::<1, 2, HIGH>(nb, [w1], at, stride, [p1]);
                    }
                }
                _ => {
                    k4_nt::<1, 1, HIGH>(nb, [w0], at, stride, [p0]);
                    if pair {
                        k4_nt::<1, 1, HIGH>(nb, [w1], at, stride, [p1]);
                    }
                }
            }
            t += g;
        }
        r += if pair { 2 } else { 1 };
    }
}

/// Q4_K (`HIGH = false`) / Q5_K row kernel (see `crate::kernels::RowKernel`).
#[allow(clippy::too_many_arguments)]
fn k4_row_kernel<const HIGH: bool>(
    n: usize,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    a: &[u8],
    stride: usize,
    nt: usize,
    out: &mut [f32],
) {
    let nb = n / 256;
    if rows == 0 || nt == 0 {
        return;
    }
    let bb = if HIGH { 176 } else { 144 };
    assert!(
        w.len() >= (rows - 1) * row_bytes + nb * bb,
        "weight rows too short"
    );
    assert!(
        a.len() >= (nt - 1) * stride + nb * Q8K_BYTES,
        "activation rows too short"
    );
    assert!(out.len() >= rows * nt, "output too short");
    // SAFETY: sizes checked above; AVX-512 F/BW presence is the module invariant.
    unsafe {
        k4_rows::<HIGH>(
            nb,
            w.as_ptr(),
            row_bytes,
            rows,
            a.as_ptr(),
            stride,
            nt,
            out.as_mut_ptr(),
        )
    }
}

/// Q4_K row kernel.
pub(crate) const Q4_K_ROWS: RowKernel = k4_row_kernel::<false>;
/// Q5_K row kernel.
pub(crate) const Q5_K_ROWS: RowKernel = k4_row_kernel::<true>;
