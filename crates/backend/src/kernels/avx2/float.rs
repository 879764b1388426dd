//! F32 / F16 / BF16 weight rows against f32 activation rows (already rounded to the weight's
//! float type by [`crate::ActType`]).

use super::row_kernel;
use super::util::{hsum_ps, prefetch_ahead};
use std::arch::x86_64::*;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// 8 weights from `w` element `i`, widened to f32.
#[inline(always)]
unsafe fn load_w<const KIND: u8>(w: *const u8, i: usize) -> __m256 {
    match KIND {
        F32 => _mm256_loadu_ps((w as *const f32).add(i)),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128((w as *const u16).add(i) as *const __m128i)),
        _ => {
            let h = _mm_loadu_si128((w as *const u16).add(i) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// The scalar weight `i`, widened to f32.
#[inline(always)]
unsafe fn load_w1<const KIND: u8>(w: *const u8, i: usize) -> f32 {
    match KIND {
        F32 => (w as *const f32).add(i).read_unaligned(),
        F16 => half::f16::from_bits((w as *const u16).add(i).read_unaligned()).to_f32(),
        _ => half::bf16::from_bits((w as *const u16).add(i).read_unaligned()).to_f32(),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_nt<const NT: usize, const KIND: u8>(
    n: usize,
    w: *const u8,
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; NT];
    let mut i = 0;
    let w_bytes = if KIND == F32 { 4 } else { 2 };
    while i + 16 <= n {
        prefetch_ahead::<1>(w.add(i * w_bytes));
        let w0 = load_w::<KIND>(w, i);
        let w1 = load_w::<KIND>(w, i + 8);
        for (t, acc) in acc.iter_mut().enumerate() {
            let ap = a.add(t * stride) as *const f32;
            acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(ap.add(i)), acc[0]);
            acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(ap.add(i + 8)), acc[1]);
        }
        i += 16;
    }
    if i + 8 <= n {
        let w0 = load_w::<KIND>(w, i);
        for (t, acc) in acc.iter_mut().enumerate() {
            let ap = a.add(t * stride) as *const f32;
            acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(ap.add(i)), acc[0]);
        }
        i += 8;
    }
    for (t, acc) in acc.iter().enumerate() {
        let ap = a.add(t * stride) as *const f32;
        let mut s = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
        for j in i..n {
            s += load_w1::<KIND>(w, j) * ap.add(j).read_unaligned();
        }
        *out.add(t) = s;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_nt<const NT: usize>(n: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    float_nt::<NT, F32>(n, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_nt<const NT: usize>(n: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    float_nt::<NT, F16>(n, w, a, s, o)
}
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_nt<const NT: usize>(n: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    float_nt::<NT, BF16>(n, w, a, s, o)
}

row_kernel!(f32_rows, f32_nt, 1, 4, 4);
row_kernel!(f16_rows, f16_nt, 1, 2, 4);
row_kernel!(bf16_rows, bf16_nt, 1, 2, 4);
