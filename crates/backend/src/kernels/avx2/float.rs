//! F32 / F16 / BF16 weight rows against f32 activation rows (already rounded to the weight's
//! float type by [`crate::ActType`]).

use super::row_kernel;
use super::util::hsum_ps;
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
    while i + 16 <= n {
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

/// Two weight rows against `NT` tokens: each activation load meets both rows (one f32 chain
/// per row and token, 8 lanes wide: another order of additions than [`float_nt`]'s).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float2_nt<const NT: usize, const KIND: u8>(
    n: usize,
    w0: *const u8,
    w1: *const u8,
    a: *const u8,
    stride: usize,
    out0: *mut f32,
    out1: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; NT];
    let mut i = 0;
    while i + 8 <= n {
        let (x0, x1) = (load_w::<KIND>(w0, i), load_w::<KIND>(w1, i));
        for (t, acc) in acc.iter_mut().enumerate() {
            let av = _mm256_loadu_ps((a.add(t * stride) as *const f32).add(i));
            acc[0] = _mm256_fmadd_ps(x0, av, acc[0]);
            acc[1] = _mm256_fmadd_ps(x1, av, acc[1]);
        }
        i += 8;
    }
    for (t, acc) in acc.iter().enumerate() {
        let ap = a.add(t * stride) as *const f32;
        let (mut s0, mut s1) = (hsum_ps(acc[0]), hsum_ps(acc[1]));
        for j in i..n {
            let x = ap.add(j).read_unaligned();
            s0 += load_w1::<KIND>(w0, j) * x;
            s1 += load_w1::<KIND>(w1, j) * x;
        }
        *out0.add(t) = s0;
        *out1.add(t) = s1;
    }
}

/// The float row kernels (see `crate::kernels::RowKernel`): with 2+ tokens rows in pairs
/// ([`float2_nt`]), an odd last one alone; with one token a row at a time; tokens in
/// groups of 4, 2, 1.
macro_rules! float_rows {
    ($name:ident, $kind:expr, $w_bytes:expr) => {
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(
            n: usize,
            w: &[u8],
            row_bytes: usize,
            rows: usize,
            a: &[u8],
            stride: usize,
            nt: usize,
            out: &mut [f32],
        ) {
            if rows == 0 || nt == 0 {
                return;
            }
            assert!(
                w.len() >= (rows - 1) * row_bytes + n * $w_bytes,
                "weight rows too short"
            );
            assert!(
                a.len() >= (nt - 1) * stride + n * 4,
                "activation rows too short"
            );
            assert!(out.len() >= rows * nt, "output too short");

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn each(
                n: usize,
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
                    // Pairs for 2+ tokens only: a pair against one token (decode) ran BF16
                    // tg128 at 32 tok/s against 60 with a row at a time (the pair's two weight
                    // streams stall on memory), while prefill gains 26%.
                    let pair = r + 1 < rows && nt >= 2;
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
                        match (g, pair) {
                            (4, true) => float2_nt::<4, { $kind }>(
                                n,
                                w0,
                                w1,
                                at,
                                stride,
                                o0.add(t),
                                o1.add(t),
                            ),
                            (2, true) => float2_nt::<2, { $kind }>(
                                n,
                                w0,
                                w1,
                                at,
                                stride,
                                o0.add(t),
                                o1.add(t),
                            ),
                            (_, true) => float2_nt::<1, { $kind }>(
                                n,
                                w0,
                                w1,
                                at,
                                stride,
                                o0.add(t),
                                o1.add(t),
                            ),
                            (4, false) => float_nt::<4, { $kind }>(n, w0, at, stride, o0.add(t)),
                            (2, false) => float_nt::<2, { $kind }>(n, w0, at, stride, o0.add(t)),
                            (_, false) => float_nt::<1, { $kind }>(n, w0, at, stride, o0.add(t)),
                        }
                        t += g;
                    }
                    r += if pair { 2 } else { 1 };
                }
            }
            // SAFETY: sizes checked above (row r + 1 is read only when it exists);
            // AVX2/FMA/F16C presence is the module invariant.
            unsafe {
                each(
                    n,
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
    };
}

float_rows!(f32_rows, F32, 4);
// One row at a time: the sums of `float_nt` (two chains, alternating every 8 columns), the
// order the register-dequantizing kernels of `exact.rs` keep, for the dequantized tiles of
// `QMatrix::with_f32_activations` — so a token's result is the same in a batch of ≤ 4
// tokens (those kernels) as in a larger one (a tile, then this kernel).
row_kernel!(f32_rows_single, f32_nt, 1, 4, 4);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_nt<const NT: usize>(n: usize, w: *const u8, a: *const u8, s: usize, o: *mut f32) {
    float_nt::<NT, F32>(n, w, a, s, o)
}
float_rows!(f16_rows, F16, 2);
float_rows!(bf16_rows, BF16, 2);
