//! Activation rows to Q8_0 and Q8_K blocks, bit for bit the scalar conversion of
//! [`crate::quantize_act_row`].
//!
//! Per block the scalar steps are kept exactly: `amax` (a max, so any order gives the same
//! value; NaN lanes are skipped as `f32::max` skips them), `d = amax / 127` and `id = 1 / d`
//! in scalar f32, then per value `v * id` (one IEEE multiply), Q8_0's round half away from
//! zero (`trunc(y) + sign(y)` where `|y - trunc(y)| >= 0.5`; the difference is exact) or
//! Q8_K's round half to even (`vroundps`), the clamp to ±127 and a NaN lane to 0 (the scalar
//! `NaN as i8`). Q8_K's 16-value sums are added from the same integers.

use crate::act::Q8_0_ACT_BYTES;
use std::arch::x86_64::*;

/// Q8_K block: `d: f32 | qs: [i8; 256] | bsums: [i16; 16]`.
const Q8K_BYTES: usize = 292;

/// The max of `|v|` over `n` (a multiple of 8) values at `x`, NaNs skipped.
#[inline(always)]
unsafe fn amax(x: *const f32, n: usize) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        // max_ps returns its second operand when either is NaN: the running max stays.
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x.add(i)), abs), m);
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_movehdup_ps(h));
    _mm_cvtss_f32(h)
}

/// 8 values at `x` times `id`, rounded (half away from zero unless `EVEN`), clamped to ±127,
/// NaN to 0, as i32 lanes.
#[inline(always)]
unsafe fn round8<const EVEN: bool>(x: *const f32, id: __m256) -> __m256i {
    let y = _mm256_mul_ps(_mm256_loadu_ps(x), id);
    let r = if EVEN {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y)
    } else {
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let frac = _mm256_and_ps(_mm256_sub_ps(y, t), abs);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        // sign(y) · 1.0 where the fraction is a half or more, else 0.
        let one = _mm256_or_ps(
            _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN))),
            _mm256_set1_ps(1.0),
        );
        _mm256_add_ps(t, _mm256_and_ps(up, one))
    };
    let c = _mm256_max_ps(
        _mm256_min_ps(r, _mm256_set1_ps(127.0)),
        _mm256_set1_ps(-127.0),
    );
    // min/max pass a NaN in their first operand through to the second: r NaN gave -127 or
    // 127 above; the ordered mask of y (NaN iff r is) zeroes those lanes.
    let c = _mm256_and_ps(c, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
    _mm256_cvtps_epi32(c)
}

/// 32 i32 lanes (a..d, in order) to 32 bytes in order.
#[inline(always)]
unsafe fn pack32(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
    let ab = _mm256_packs_epi32(a, b);
    let cd = _mm256_packs_epi32(c, d);
    let abcd = _mm256_packs_epi16(ab, cd);
    // packs interleave the 128-bit halves: dwords come out as a0 b0 c0 d0 a1 b1 c1 d1.
    _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// `x` (a multiple of 32 values) to Q8_0 activation blocks in `out`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `out` holds `x.len() / 32` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_row(x: &[f32], out: &mut [u8]) {
    for (o, xb) in out.chunks_exact_mut(Q8_0_ACT_BYTES).zip(x.chunks_exact(32)) {
        let p = xb.as_ptr();
        let d = amax(p, 32) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        o[0..4].copy_from_slice(&half::f16::from_f32(d).to_f32().to_le_bytes());
        let idv = _mm256_set1_ps(id);
        let q = pack32(
            round8::<false>(p, idv),
            round8::<false>(p.add(8), idv),
            round8::<false>(p.add(16), idv),
            round8::<false>(p.add(24), idv),
        );
        _mm256_storeu_si256(o.as_mut_ptr().add(4) as *mut __m256i, q);
    }
}

/// Sum of the 8 i32 lanes of each of `v[0..4]`, as 4 lanes.
#[inline(always)]
unsafe fn hsum4(v: [__m256i; 4]) -> __m128i {
    let ab = _mm256_hadd_epi32(v[0], v[1]);
    let cd = _mm256_hadd_epi32(v[2], v[3]);
    let abcd = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(
        _mm256_castsi256_si128(abcd),
        _mm256_extracti128_si256::<1>(abcd),
    )
}

/// `x` (a multiple of 256 values) to Q8_K activation blocks in `out`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `out` holds `x.len() / 256` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_k_row(x: &[f32], out: &mut [u8]) {
    for (o, xb) in out.chunks_exact_mut(Q8K_BYTES).zip(x.chunks_exact(256)) {
        let p = xb.as_ptr();
        let d = amax(p, 256) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        o[0..4].copy_from_slice(&d.to_le_bytes());
        let idv = _mm256_set1_ps(id);
        let qs = o.as_mut_ptr().add(4);
        let bsums = o.as_mut_ptr().add(4 + 256) as *mut __m128i;
        // 4 groups of 16 values a pass: 64 values, two 32-byte stores, 4 sums.
        for pass in 0..4 {
            let base = 64 * pass;
            let mut v = [_mm256_setzero_si256(); 8];
            for (k, vk) in v.iter_mut().enumerate() {
                *vk = round8::<true>(p.add(base + 8 * k), idv);
            }
            _mm256_storeu_si256(qs.add(base) as *mut __m256i, pack32(v[0], v[1], v[2], v[3]));
            _mm256_storeu_si256(
                qs.add(base + 32) as *mut __m256i,
                pack32(v[4], v[5], v[6], v[7]),
            );
            let s = hsum4([
                _mm256_add_epi32(v[0], v[1]),
                _mm256_add_epi32(v[2], v[3]),
                _mm256_add_epi32(v[4], v[5]),
                _mm256_add_epi32(v[6], v[7]),
            ]);
            // 4 sums of at most 16·127: i16 without saturation, stored in order.
            let s16 = _mm_packs_epi32(s, s);
            _mm_storel_epi64((bsums as *mut u8).add(8 * pass) as *mut __m128i, s16);
        }
    }
}
