//! AVX-512 (F + BW) kernels for the hottest K-quants: Q4_K and Q5_K against Q8_K.
//!
//! Same structure as the AVX2 `k4` kernel (one weight row, `NT <= 4` tokens), but one 512-bit
//! register holds a whole 64-value chunk: the 32 packed bytes are broadcast to both halves,
//! the upper half shifted right by 4, so lanes `0..64` hold values `64j..64j+64` in order and
//! meet one contiguous 64-byte activation load. That halves the `maddubs`/`madd` count per
//! value. Integer sums are the same as the scalar kernel's; only the f32 order differs.
//!
//! Safety invariant: only reached through [`crate::kernels::row_kernel`] with
//! [`crate::Isa::Avx512`], which `matmul_with` uses only after run-time detection.

use super::avx2::row_kernel;
use super::avx2::util::{f16_at, f32_at, hsum_ps, hsum_ps128};
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

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn k4_nt<const NT: usize, const HIGH: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let bb = if HIGH { 176 } else { 144 };
    let qs_off = if HIGH { 48 } else { 16 };
    let m4 = _mm512_set1_epi8(0x0F);
    // Shift the upper 256 bits by 4: the high nibbles become the second 32 values.
    let shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
    let mut acc = [_mm512_setzero_ps(); NT];
    let mut accm = [_mm_setzero_ps(); NT];
    for ib in 0..nb {
        let x = w.add(ib * bb);
        let (d, dmin) = (f16_at(x), f16_at(x.add(2)));
        let sm = k4_scales_mins(x.add(4));
        let sm16 = _mm256_cvtepu8_epi16(sm); // lanes 0..8 scales, 8..16 mins
        let mins = _mm256_extracti128_si256::<1>(sm16);
        let scales = _mm512_castsi256_si512(sm16);
        let hbits = if HIGH {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(x.add(16) as *const __m256i))
        } else {
            _mm512_setzero_si512()
        };
        for (t, am) in accm.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8K_BYTES);
            let bs = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
            let pairs = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let md = _mm_cvtepi32_ps(_mm_madd_epi16(mins, pairs));
            *am = _mm_fmadd_ps(_mm_set1_ps(dmin * f32_at(y)), md, *am);
        }
        let mut sumi = [_mm512_setzero_si512(); NT];
        for j in 0..4 {
            let packed = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                x.add(qs_off + 32 * j) as *const __m256i
            ));
            let mut q = _mm512_and_si512(_mm512_srlv_epi16(packed, shift), m4);
            if HIGH {
                let bits = _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8((1u8 << (2 * j)) as i8),
                    _mm256_set1_epi8((2u8 << (2 * j)) as i8),
                );
                let k = _mm512_test_epi8_mask(hbits, bits);
                q = _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
            }
            let idx = _mm512_inserti64x4::<1>(
                _mm512_set1_epi16(2 * j as i16),
                _mm256_set1_epi16(2 * j as i16 + 1),
            );
            let scale = _mm512_permutexvar_epi16(idx, scales);
            for (t, s) in sumi.iter_mut().enumerate() {
                let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 64 * j);
                let q8 = _mm512_loadu_si512(y as *const __m512i);
                *s = _mm512_add_epi32(*s, _mm512_madd_epi16(scale, _mm512_maddubs_epi16(q, q8)));
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let yd = f32_at(a.add(t * stride + ib * Q8K_BYTES));
            *acc = _mm512_fmadd_ps(_mm512_set1_ps(d * yd), _mm512_cvtepi32_ps(sumi[t]), *acc);
        }
    }
    for t in 0..NT {
        let v = acc[t];
        // The upper 8 lanes through the f64 view: `extractf32x8` is AVX-512DQ, which this
        // function does not enable (it was an out-of-line call a row).
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let s = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
        *out.add(t) = hsum_ps(s) - hsum_ps128(accm[t]);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q4_k_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    k4_nt::<NT, false>(nb, w, a, s, o)
}
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q5_k_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    k4_nt::<NT, true>(nb, w, a, s, o)
}

row_kernel!(
    q4_k_rows,
    q4_k_nt,
    256,
    144,
    Q8K_BYTES,
    "avx512f,avx512bw,avx2,fma,f16c"
);
row_kernel!(
    q5_k_rows,
    q5_k_nt,
    256,
    176,
    Q8K_BYTES,
    "avx512f,avx512bw,avx2,fma,f16c"
);
