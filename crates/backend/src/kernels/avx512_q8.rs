//! AVX-512 (F + BW) Q8_0 row kernel: eight weight rows at a time, each row's result the
//! scalar vec_dot's bit for bit.
//!
//! A row's result is defined by [`scalar::vec_dot_q8_0_q8_0`]: per 32-value block the exact
//! integer sum `isum = Σ w·a`, then `sum += f32(isum)·dw·da` in f32 (left to right), blocks
//! in order. The integer sums do not depend on grouping and the f32 steps are the same lane by
//! lane, so a row's bits do not depend on which rows or tokens share a call.
//!
//! As in `avx512` (Q4_K), the 8 rows' 32-byte blocks are transposed in registers so that one
//! 512-bit register holds the same 8 bytes of every row (two i32 lanes a row) and meets one
//! broadcast 8-byte activation load; `|w|` and the signs are taken once a block for all the
//! tokens, and each row's block sum reaches f32 with the 8 rows in one register. The f32 work
//! of a block, a third of the AVX2 kernel's instructions a value, is then shared by 8 rows.
//!
//! Safety invariant: only reached through [`crate::kernels::row_kernel`] with
//! [`crate::Isa::Avx512`], which `matmul_with` uses only after run-time detection.

use super::scalar;
use crate::act::Q8_0_ACT_BYTES;
use crate::kernels::RowKernel;
use std::arch::x86_64::*;

const BLOCK: usize = 34;

/// Rows of a group in the order of its result lanes (as in `avx512`).
const ORDER: [usize; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// The 8 rows' 32 bytes at `x[r] + off` transposed: `z[i]` holds bytes `8i..8i+8` of every
/// row's, 128-bit lane `L` the rows (0,1), (4,5), (2,3), (6,7).
#[inline(always)]
unsafe fn chunk8(x: &[*const u8; 8], off: usize) -> [__m512i; 4] {
    let ld = |r: usize| _mm256_loadu_si256(x[r].add(off) as *const __m256i);
    let pair = |r: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld(r)), ld(r + 4));
    let (p0, p1, p2, p3) = (pair(0), pair(1), pair(2), pair(3));
    let (l01, h01) = (_mm512_unpacklo_epi64(p0, p1), _mm512_unpackhi_epi64(p0, p1));
    let (l23, h23) = (_mm512_unpacklo_epi64(p2, p3), _mm512_unpackhi_epi64(p2, p3));
    [
        _mm512_shuffle_i64x2::<0b10_00_10_00>(l01, l23),
        _mm512_shuffle_i64x2::<0b10_00_10_00>(h01, h23),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(l01, l23),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(h01, h23),
    ]
}

/// Rows `x0[0..8]` (block 0 of each at `x0[r]`) against `NT` tokens: `out[r][t]`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn rows8<const NT: usize>(
    nb: usize,
    x0: [*const u8; 8],
    a: *const u8,
    stride: usize,
    out: &mut [[f32; NT]; 8],
) {
    let ones = _mm512_set1_epi16(1);
    let zero = _mm512_setzero_si512();
    // Lane pairs' i32 sums (dword 2k of the total in dword 2k) in ORDER.
    let pair_idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
    let mut sum = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x: [*const u8; 8] = std::array::from_fn(|r| x0[r].add(ib * BLOCK));
        let dw = _mm256_cvtph_ps(_mm_set_epi16(
            (x[7] as *const i16).read_unaligned(),
            (x[6] as *const i16).read_unaligned(),
            (x[3] as *const i16).read_unaligned(),
            (x[2] as *const i16).read_unaligned(),
            (x[5] as *const i16).read_unaligned(),
            (x[4] as *const i16).read_unaligned(),
            (x[1] as *const i16).read_unaligned(),
            (x[0] as *const i16).read_unaligned(),
        ));
        let z = chunk8(&x, 2);
        let aw: [__m512i; 4] = std::array::from_fn(|i| _mm512_abs_epi8(z[i]));
        let neg: [__mmask64; 4] = std::array::from_fn(|i| _mm512_movepi8_mask(z[i]));
        for (t, sum) in sum.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8_0_ACT_BYTES);
            let mut isum = zero;
            for i in 0..4 {
                let q = _mm512_set1_epi64((y.add(4 + 8 * i) as *const i64).read_unaligned());
                // a·sign(w) (|a| <= 127: no overflow), then |w|·that in i16 pairs (at most
                // 2·128·127, no saturation).
                let qs = _mm512_mask_sub_epi8(q, neg[i], zero, q);
                let p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw[i], qs), ones);
                isum = _mm512_add_epi32(isum, p);
            }
            let s = _mm512_add_epi32(isum, _mm512_shuffle_epi32::<0b10_11_00_01>(isum));
            let is8 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(pair_idx, s));
            // sum += f32(isum) · dw · da, as the scalar vec_dot.
            let da = _mm256_set1_ps((y as *const f32).read_unaligned());
            let p = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(is8), dw), da);
            *sum = _mm256_add_ps(*sum, p);
        }
    }
    for (t, s) in sum.iter().enumerate() {
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), *s);
        for (k, &r) in ORDER.iter().enumerate() {
            out[r][t] = v[k];
        }
    }
}

/// Rows in groups of 8 (the rest through the scalar vec_dot), tokens in groups of up to 4.
#[allow(clippy::too_many_arguments)]
fn q8_0_rows(
    n: usize,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    a: &[u8],
    stride: usize,
    nt: usize,
    out: &mut [f32],
) {
    let nb = n / 32;
    if rows == 0 || nt == 0 {
        return;
    }
    assert!(
        w.len() >= (rows - 1) * row_bytes + nb * BLOCK,
        "weight rows too short"
    );
    assert!(
        a.len() >= (nt - 1) * stride + nb * Q8_0_ACT_BYTES,
        "activation rows too short"
    );
    assert!(out.len() >= rows * nt, "output too short");
    let groups = rows / 8;
    for g in 0..groups {
        let x: [*const u8; 8] = std::array::from_fn(|r| w[(8 * g + r) * row_bytes..].as_ptr());
        let mut t = 0;
        while t < nt {
            let k = (nt - t).min(4);
            let at = a[t * stride..].as_ptr();
            // SAFETY: the rows' nb blocks and the tokens' nb activation blocks lie inside `w`
            // and `a` (checked above); AVX-512 F/BW presence is the module invariant.
            unsafe {
                match k {
                    4 => put(g, t, nt, out, &rows8_call::<4>(nb, x, at, stride)),
                    3 => put(g, t, nt, out, &rows8_call::<3>(nb, x, at, stride)),
                    2 => put(g, t, nt, out, &rows8_call::<2>(nb, x, at, stride)),
                    _ => put(g, t, nt, out, &rows8_call::<1>(nb, x, at, stride)),
                }
            }
            t += k;
        }
    }
    for r in 8 * groups..rows {
        for t in 0..nt {
            out[r * nt + t] = scalar::vec_dot_q8_0_q8_0(n, &w[r * row_bytes..], &a[t * stride..]);
        }
    }
}

/// [`rows8`] into a fresh array.
#[inline(always)]
unsafe fn rows8_call<const NT: usize>(
    nb: usize,
    x: [*const u8; 8],
    a: *const u8,
    stride: usize,
) -> [[f32; NT]; 8] {
    let mut o = [[0f32; NT]; 8];
    rows8::<NT>(nb, x, a, stride, &mut o);
    o
}

/// Group `g`'s results for tokens `t..t + NT` into `out[r * nt + t]`.
fn put<const NT: usize>(g: usize, t: usize, nt: usize, out: &mut [f32], v: &[[f32; NT]; 8]) {
    for (r, row) in v.iter().enumerate() {
        out[(8 * g + r) * nt + t..][..NT].copy_from_slice(row);
    }
}

/// Q8_0 row kernel (see `crate::kernels::RowKernel`).
pub(crate) const Q8_0_ROWS: RowKernel = q8_0_rows;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_the_scalar_vec_dot_bit_for_bit() {
        if !crate::Isa::Avx512.is_available() {
            eprintln!("no AVX-512 F/BW on this CPU: nothing to check");
            return;
        }
        let mut s = 7u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for (rows, nb, nt) in [(8, 1, 1), (16, 3, 4), (13, 2, 7), (27, 5, 3)] {
            // Weights over the whole i8 range (-128 included); activations in -127..=127.
            let mut w = vec![0u8; rows * nb * BLOCK];
            for b in w.chunks_exact_mut(BLOCK) {
                let h = (next() as u16 & 0x83ff) | ((10 + next() % 8) as u16) << 10;
                b[..2].copy_from_slice(&h.to_le_bytes());
                for v in b[2..].iter_mut() {
                    *v = next() as u8;
                }
            }
            for b in w.chunks_exact_mut(BLOCK).step_by(4) {
                b[2..].fill(0x80);
            }
            let mut a = vec![0u8; nt * nb * Q8_0_ACT_BYTES];
            for b in a.chunks_exact_mut(Q8_0_ACT_BYTES) {
                let d = ((next() % 2000) as f32 - 1000.0) * 1e-4;
                b[..4].copy_from_slice(&d.to_le_bytes());
                let extreme = next() % 4 == 0;
                for v in b[4..].iter_mut() {
                    let q = if extreme {
                        -127
                    } else {
                        (next() % 255) as i32 - 127
                    };
                    *v = q as i8 as u8;
                }
            }
            let (row_bytes, n) = (nb * BLOCK, nb * 32);
            let mut out = vec![f32::NAN; rows * nt];
            q8_0_rows(
                n,
                &w,
                row_bytes,
                rows,
                &a,
                nb * Q8_0_ACT_BYTES,
                nt,
                &mut out,
            );
            for r in 0..rows {
                for t in 0..nt {
                    let want = scalar::vec_dot_q8_0_q8_0(
                        n,
                        &w[r * row_bytes..],
                        &a[t * nb * Q8_0_ACT_BYTES..],
                    );
                    assert_eq!(
                        out[r * nt + t].to_bits(),
                        want.to_bits(),
                        "rows {rows} nb {nb} row {r} token {t}: {} vs {want}",
                        out[r * nt + t]
                    );
                }
            }
        }
    }
}
