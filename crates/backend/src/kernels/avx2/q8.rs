//! 32-value block types: Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 against Q8_0 activations, and
//! Q4_1, Q5_1 against Q8_1 activations.
//!
//! Per block: unpack the weight block to 32 signed bytes `qx` once, then for each token
//! `Σ qx·qy` via `maddubs(|qx|, sign(qy, qx))` (exact: |products| <= 127·127, pair sums fit
//! an i16) and `acc += d_w·d_a·Σ`.

use super::row_kernel;
use super::util::{
    e8m0_half_scale, f16x8_at, hsum_ps, mul_i8_pairs_i16, nibbles_32, prefetch_ahead, sum_i16_pairs,
};
use crate::act::{Q8_0_ACT_BYTES, Q8_1_ACT_BYTES};
use crate::dequant::{KVALUES_IQ4NL, KVALUES_MXFP4};
use std::arch::x86_64::*;

pub(crate) const Q8_0: u8 = 0;
pub(crate) const Q4_0: u8 = 1;
pub(crate) const IQ4_NL: u8 = 2;
pub(crate) const MXFP4: u8 = 3;
pub(crate) const Q5_0: u8 = 4;

/// Bytes of one weight block of `kind`.
pub(crate) const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q8_0 => 34,
        Q4_0 | IQ4_NL => 18,
        Q5_0 => 22,
        _ => 17,
    }
}

#[inline(always)]
unsafe fn table(values: &[i8; 16]) -> __m256i {
    let t = _mm_loadu_si128(values.as_ptr() as *const __m128i);
    _mm256_set_m128i(t, t)
}

/// The value table `q8_block` looks `KIND`'s nibbles up in (IQ4_NL's or MXFP4's; unused by
/// the others).
#[inline(always)]
pub(crate) unsafe fn lut(kind: u8) -> __m256i {
    match kind {
        MXFP4 => table(&KVALUES_MXFP4),
        _ => table(&KVALUES_IQ4NL),
    }
}

/// Block `x` of `KIND`: its scale in 8 lanes and its 32 values as signed bytes, in order
/// (`lut` from [`lut`]).
#[inline(always)]
pub(crate) unsafe fn q8_block<const KIND: u8>(x: *const u8, lut: __m256i) -> (__m256, __m256i) {
    match KIND {
        Q8_0 => (f16x8_at(x), _mm256_loadu_si256(x.add(2) as *const __m256i)),
        Q4_0 => (
            f16x8_at(x),
            _mm256_sub_epi8(nibbles_32(x.add(2)), _mm256_set1_epi8(8)),
        ),
        IQ4_NL => (f16x8_at(x), _mm256_shuffle_epi8(lut, nibbles_32(x.add(2)))),
        // 5th bit clear: `q | 0xF0` is `q - 16` as i8; set: `q` is `(q + 16) - 16`.
        Q5_0 => {
            let hi = bits_32(x.add(2));
            (
                f16x8_at(x),
                _mm256_or_si256(
                    nibbles_32(x.add(6)),
                    _mm256_andnot_si256(hi, _mm256_set1_epi8(0xF0u8 as i8)),
                ),
            )
        }
        _ => (
            _mm256_set1_ps(e8m0_half_scale(*x)),
            _mm256_shuffle_epi8(lut, nibbles_32(x.add(1))),
        ),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_family_nt<const NT: usize, const KIND: u8>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let bb = block_bytes(KIND);
    let lut = lut(KIND);
    let mut acc = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        prefetch_ahead::<1>(w.add(ib * bb));
        let (dx, qx) = q8_block::<KIND>(w.add(ib * bb), lut);
        let ax = _mm256_sign_epi8(qx, qx);
        for (t, acc) in acc.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8_0_ACT_BYTES);
            let qy = _mm256_loadu_si256(y.add(4) as *const __m256i);
            let dot = _mm256_cvtepi32_ps(sum_i16_pairs(mul_i8_pairs_i16(ax, qx, qy)));
            let dy = _mm256_set1_ps((y as *const f32).read_unaligned());
            *acc = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), dot, *acc);
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        *out.add(t) = hsum_ps(*acc);
    }
}

/// 0xFF in byte `i` where bit `i` of the little-endian u32 at `p` is set, else 0.
#[inline(always)]
pub(crate) unsafe fn bits_32(p: *const u8) -> __m256i {
    let x32 = (p as *const i32).read_unaligned();
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

/// Q4_1 (`FIVE = false`) and Q5_1 (`FIVE = true`) against Q8_1: unsigned quants, so
/// `maddubs(q, qy)` directly, plus the min term `m·s`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_1_family_nt<const NT: usize, const FIVE: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let bb = if FIVE { 24 } else { 20 };
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut accm = [0f32; NT];
    for ib in 0..nb {
        let x = w.add(ib * bb);
        let (dx, mx) = (f16x8_at(x), super::util::f16_at(x.add(2)));
        let qx = if FIVE {
            let hi = _mm256_and_si256(bits_32(x.add(4)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles_32(x.add(8)), hi)
        } else {
            nibbles_32(x.add(4))
        };
        for t in 0..NT {
            let y = a.add(t * stride + ib * Q8_1_ACT_BYTES);
            let qy = _mm256_loadu_si256(y.add(8) as *const __m256i);
            let dot = _mm256_cvtepi32_ps(sum_i16_pairs(_mm256_maddubs_epi16(qx, qy)));
            let dy = _mm256_set1_ps((y as *const f32).read_unaligned());
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), dot, acc[t]);
            accm[t] += mx * (y.add(4) as *const f32).read_unaligned();
        }
    }
    for t in 0..NT {
        *out.add(t) = hsum_ps(acc[t]) + accm[t];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_1_family_nt::<NT, false>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_1_family_nt::<NT, true>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_family_nt::<NT, Q5_0>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_family_nt::<NT, Q8_0>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_family_nt::<NT, Q4_0>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_nl_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_family_nt::<NT, IQ4_NL>(nb, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_nt<const NT: usize>(nb: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    q8_family_nt::<NT, MXFP4>(nb, w, a, s, o)
}

row_kernel!(q8_0_rows, q8_0_nt, 32, 34, Q8_0_ACT_BYTES);
row_kernel!(q4_0_rows, q4_0_nt, 32, 18, Q8_0_ACT_BYTES);
row_kernel!(iq4_nl_rows, iq4_nl_nt, 32, 18, Q8_0_ACT_BYTES);
row_kernel!(mxfp4_rows, mxfp4_nt, 32, 17, Q8_0_ACT_BYTES);
row_kernel!(q5_0_rows, q5_0_nt, 32, 22, Q8_0_ACT_BYTES);
row_kernel!(q4_1_rows, q4_1_nt, 32, 20, Q8_1_ACT_BYTES);
row_kernel!(q5_1_rows, q5_1_nt, 32, 24, Q8_1_ACT_BYTES);
