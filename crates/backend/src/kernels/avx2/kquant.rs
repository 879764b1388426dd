//! 256-value super-block types paired with Q8_K activations: Q4_K, Q5_K, Q6_K, IQ4_XS.
//!
//! Per super-block the weight nibbles/bits and scales are unpacked once and reused for every
//! token of the group. Min / offset terms use the activation's 16-value partial sums
//! (`bsums`): `Σ (q - o)·q8 = Σ q·q8 - o·Σ q8`, so no per-token work is spent on them beyond
//! one `madd`. Saturation: `maddubs` sees unsigned weights <= 63 (Q6_K) or |w| <= 127 with
//! |a| <= 127 (IQ4_XS, sign trick), so every i16 pair sum stays below 2^15.

use super::row_kernel;
use super::util::{
    f16_at, f16x2_at, f32_at, hsum_ps, hsum_ps128, mul_i8_pairs_i16, prefetch_ahead,
};
use crate::dequant::KVALUES_IQ4NL;
use std::arch::x86_64::*;

/// Offset of `qs` in a Q8_K activation block, and of `bsums`.
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// Q4_K/Q5_K 6-bit scales and mins, unpacked as ggml does: lanes 0..8 of the result are the
/// 8 scales, lanes 8..16 the 8 mins, as i16. `p` is the 12 scale bytes `s` (16 are read:
/// the block continues past them); for j < 4 `sc_j = s_j & 63`, `m_j = s_{j+4} & 63`, and for
/// j >= 4 `sc_j = (s_{j+4} & 15) | (s_{j-4} >> 6) << 4`, `m_j = (s_{j+4} >> 4) | (s_j >> 6) << 4`.
/// In vector lanes (9 instructions where ggml's scalar form takes ~20 and 4 inserts).
#[inline(always)]
pub(super) unsafe fn k4_scales_mins(p: *const u8) -> __m256i {
    const Z: i8 = -1; // pshufb: a zero byte
    let v = _mm_loadu_si128(p as *const __m128i);
    // [s0..4, s8..12, s4..8, s8..12]: the low 6 bits (j < 4) or the nibbles (j >= 4).
    let low = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    // The mins' nibbles of j >= 4 are the high ones: lanes 12..16 shifted down by 4.
    let low = _mm_blend_epi32::<0b1000>(low, _mm_srli_epi16::<4>(low));
    let low = _mm_and_si128(
        low,
        _mm_setr_epi8(
            63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
        ),
    );
    // The top 2 bits of s0..4 (scales) and s4..8 (mins) of j >= 4, as bits 4 and 5.
    let top = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(Z, Z, Z, Z, 0, 1, 2, 3, Z, Z, Z, Z, 4, 5, 6, 7),
    );
    let top = _mm_and_si128(_mm_srli_epi16::<2>(top), _mm_set1_epi8(0x30));
    _mm256_cvtepu8_epi16(_mm_or_si128(low, top))
}

/// Broadcast the i16 lane `k` (0..8) of each 128-bit half.
#[inline(always)]
unsafe fn bcast_i16(v: __m256i, k: i16) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(((2 * k + 1) << 8) | (2 * k)))
}

/// `Σ_j min_j · (bsum_{2j} + bsum_{2j+1})` as 4 i32 lanes, for one Q8_K block at `y`.
#[inline(always)]
unsafe fn k4_min_dot(mins: __m128i, y: *const u8) -> __m128i {
    let bs = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
    let pairs = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    _mm_madd_epi16(mins, pairs)
}

/// Q4_K (`HIGH = false`) and Q5_K (`HIGH = true`) against Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_nt<const NT: usize, const HIGH: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let bb = if HIGH { 176 } else { 144 };
    let qs_off = if HIGH { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut accm = [_mm_setzero_ps(); NT];
    for ib in 0..nb {
        let x = w.add(ib * bb);
        prefetch_ahead::<3>(x);
        let dm = f16x2_at(x);
        let (d, dmin) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
        let sm = k4_scales_mins(x.add(4));
        let mins = _mm256_extracti128_si256::<1>(sm);
        let sc = _mm256_castsi256_si128(sm);
        let scales = _mm256_set_m128i(sc, sc);
        let hbits = if HIGH {
            _mm256_loadu_si256(x.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); NT];
        for (t, am) in accm.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8K_BYTES);
            let md = _mm_cvtepi32_ps(k4_min_dot(mins, y));
            *am = _mm_fmadd_ps(_mm_set1_ps(dmin * f32_at(y)), md, *am);
        }
        for j in 0..4 {
            let scale_l = bcast_i16(scales, 2 * j as i16);
            let scale_h = bcast_i16(scales, 2 * j as i16 + 1);
            let bits = _mm256_loadu_si256(x.add(qs_off + 32 * j) as *const __m256i);
            let mut ql = _mm256_and_si256(bits, m4);
            let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            if HIGH {
                let b_l = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                let b_h = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
                let sixteen = _mm256_set1_epi8(16);
                let h_l = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, b_l), b_l);
                let h_h = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, b_h), b_h);
                ql = _mm256_or_si256(ql, _mm256_and_si256(h_l, sixteen));
                qh = _mm256_or_si256(qh, _mm256_and_si256(h_h, sixteen));
            }
            for (t, s) in sumi.iter_mut().enumerate() {
                let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 64 * j);
                let q8l = _mm256_loadu_si256(y as *const __m256i);
                let q8h = _mm256_loadu_si256(y.add(32) as *const __m256i);
                let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(ql, q8l));
                let ph = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(qh, q8h));
                *s = _mm256_add_epi32(*s, _mm256_add_epi32(pl, ph));
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let yd = f32_at(a.add(t * stride + ib * Q8K_BYTES));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(sumi[t]), *acc);
        }
    }
    for t in 0..NT {
        *out.add(t) = hsum_ps(acc[t]) - hsum_ps128(accm[t]);
    }
}

/// Q6_K against Q8_K: `d·Σ sc·(Σ q·q8 − 32·bsum)` with q in 0..64.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_impl<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x = w.add(ib * 210);
        prefetch_ahead::<4>(x);
        let d = f16_at(x.add(208));
        let sc8 = _mm_loadu_si128(x.add(192) as *const __m128i);
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let mut sumi = [_mm256_setzero_si256(); NT];
        for (t, s) in sumi.iter_mut().enumerate() {
            let bs = _mm256_loadu_si256(
                a.add(t * stride + ib * Q8K_BYTES + Q8K_BSUMS) as *const __m256i
            );
            *s = _mm256_sub_epi32(*s, _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs)));
        }
        for j in 0..2 {
            let ql0 = _mm256_loadu_si256(x.add(64 * j) as *const __m256i);
            let ql1 = _mm256_loadu_si256(x.add(64 * j + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(x.add(128 + 32 * j) as *const __m256i);
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8))),
                ),
            ];
            for (k, qk) in q.iter().enumerate() {
                let idx = (8 * j + 2 * k) as i64;
                let mask = _mm_set_epi64x(
                    (idx + 1) * 0x0101_0101_0101_0101,
                    idx * 0x0101_0101_0101_0101,
                );
                let scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, mask));
                for (t, s) in sumi.iter_mut().enumerate() {
                    let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 128 * j + 32 * k);
                    let q8 = _mm256_loadu_si256(y as *const __m256i);
                    *s = _mm256_add_epi32(
                        *s,
                        _mm256_madd_epi16(scale, _mm256_maddubs_epi16(*qk, q8)),
                    );
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

/// IQ4_XS against Q8_K: code-book lookup by `pshufb`, 6-bit sub-block scales minus 32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_impl<const NT: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let t128 = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let m4 = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x = w.add(ib * 136);
        let d = f16_at(x);
        let scales_h = (x.add(2) as *const u16).read_unaligned() as u32;
        let mut sumi = [_mm256_setzero_si256(); NT];
        for sb in 0..8 {
            let ls = ((*x.add(4 + sb / 2) >> (4 * (sb % 2))) & 0xF) as i32
                | ((((scales_h >> (2 * sb)) & 3) as i32) << 4);
            let scale = _mm256_set1_epi16((ls - 32) as i16);
            let bits = _mm_loadu_si128(x.add(8 + 16 * sb) as *const __m128i);
            let lo = _mm_shuffle_epi8(t128, _mm_and_si128(bits, m4));
            let hi = _mm_shuffle_epi8(t128, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4));
            let qx = _mm256_set_m128i(hi, lo);
            let ax = _mm256_sign_epi8(qx, qx);
            for (t, s) in sumi.iter_mut().enumerate() {
                let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 32 * sb);
                let qy = _mm256_loadu_si256(y as *const __m256i);
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(scale, mul_i8_pairs_i16(ax, qx, qy)));
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    k4_nt::<NT, false>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    k4_nt::<NT, true>(nb, w, a, s, o)
}

row_kernel!(q4_k_rows, q4_k_nt, 256, 144, Q8K_BYTES);
row_kernel!(q5_k_rows, q5_k_nt, 256, 176, Q8K_BYTES);
row_kernel!(q6_k_rows, q6_k_impl, 256, 210, Q8K_BYTES);
row_kernel!(iq4_xs_rows, iq4_xs_impl, 256, 136, Q8K_BYTES);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::scale_min_k4;

    #[test]
    fn vector_scale_decode_is_ggmls() {
        if !crate::Isa::Avx2.is_available() {
            eprintln!("no AVX2 on this CPU: nothing to check");
            return;
        }
        // Every byte value in every position of the 12 (and 4 bytes past them, ignored).
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for case in 0..4096 {
            let mut b = [0u8; 16];
            for (i, v) in b.iter_mut().enumerate() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v = if case < 256 {
                    (case + 37 * i) as u8
                } else {
                    (state >> 56) as u8
                };
            }
            #[target_feature(enable = "avx2")]
            unsafe fn decode(p: *const u8) -> [i16; 16] {
                std::mem::transmute(k4_scales_mins(p))
            }
            // SAFETY: AVX2 checked above; 16 bytes readable.
            let got = unsafe { decode(b.as_ptr()) };
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &b[..12]);
                assert_eq!((got[j], got[8 + j]), (sc as i16, m as i16), "{b:?} j={j}");
            }
        }
    }
}
