//! AVX-512 (F + BW) Q4_K and Q5_K row kernels: eight weight rows at a time, each row's result
//! the scalar vec_dot's bit for bit.
//!
//! A row's result is defined by [`scalar::vec_dot_q4_k_q8_k`] (`vec_dot_q5_k_q8_k`): per
//! 256-value super-block the exact integer sums `isum = Σ_s sc[s]·Σ q·a` and
//! `msum = Σ_s m[s]·(bsum[2s] + bsum[2s+1])` (|isum| ≤ 8·63·32·31·128 < 2^31), then `sum += yd·(d·f32(isum) − dmin·f32(msum))` in f32,
//! super-blocks in order. Integer sums do not depend on how they are grouped, and the f32
//! steps are the same lane by lane, so a row's bits do not depend on which rows or tokens
//! share a call, and equal the scalar level's.
//!
//! Eight rows are interleaved in registers, not in memory: for each 32-byte chunk of packed
//! nibbles the rows' chunks are transposed so that one 512-bit register holds the same 8
//! bytes (16 values) of all 8 rows, two i32 lanes a row, and meets one broadcast 8-byte
//! activation load. The rows' scale/min headers (and Q5_K's high bits) are transposed and
//! unpacked together the same way. Against one row at a time (which spent most of its
//! instructions unpacking scales) this ran Q4_K GEMV 1.66x and 512-token GEMM 1.75x as fast
//! (`examples/matmul_bench`, one thread, L2-resident, 2026-12-05).
//!
//! Row order inside a group: 128-bit lane `L` holds the row pair (0,1), (4,5), (2,3), (6,7)
//! for L = 0..4; results come out in [`ORDER`].
//!
//! Safety invariant: only reached through [`crate::kernels::row_kernel`] with
//! [`crate::Isa::Avx512`], which `matmul_with` uses only after run-time detection.

use super::avx2::util::f32_at;
use super::scalar;
use crate::kernels::RowKernel;
use std::arch::x86_64::*;

/// Bytes of a Q4_K (`HIGH = false`) or Q5_K block.
const fn block_bytes(high: bool) -> usize {
    if high {
        176
    } else {
        144
    }
}
/// Offset of the packed nibbles in a block (Q5_K's 32 high-bit bytes come first, at 16).
const fn qs_at(high: bool) -> usize {
    if high {
        48
    } else {
        16
    }
}
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// Rows of a group in the order of its result lanes.
pub(super) const ORDER: [usize; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// A register from four 16-byte loads, one a 128-bit lane.
#[inline(always)]
pub(super) unsafe fn lanes4(p: [*const u8; 4]) -> __m512i {
    let v = _mm512_castsi128_si512(_mm_loadu_si128(p[0] as *const __m128i));
    let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[1] as *const __m128i));
    let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[2] as *const __m128i));
    _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[3] as *const __m128i))
}

/// Per 128-bit lane, a block header `[d|dmin, u0, u1, u2]` (u = the 12 packed scale bytes)
/// to `[8 scales, 8 mins]` as bytes, unpacked as ggml's `get_scale_min_k4`:
/// scales 0..4 = u0 & 63, mins 0..4 = u1 & 63, scales 4..8 = (u2 & 15) | (u0 >> 6) << 4,
/// mins 4..8 = (u2 >> 4) | (u1 >> 6) << 4.
#[inline(always)]
unsafe fn scales_mins(h: __m512i) -> __m512i {
    // Dwords [u0, u2, u1, u2] and [u0, u0, u1, u1].
    let a = _mm512_shuffle_epi32::<0b11_10_11_01>(h);
    let b = _mm512_shuffle_epi32::<0b10_10_01_01>(h);
    let shift = _mm512_set4_epi32(4, 0, 0, 0);
    let mask = _mm512_set4_epi32(0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f);
    let low = _mm512_and_si512(_mm512_srlv_epi32(a, shift), mask);
    // Bits 6-7 of each byte to bits 4-5 of the same byte, for dwords 1 and 3.
    let top = _mm512_set4_epi32(0x3030_3030, 0, 0x3030_3030, 0);
    let high = _mm512_and_si512(_mm512_srli_epi32::<2>(b), top);
    _mm512_or_si512(low, high)
}

/// The 8 rows' 32 bytes at offset `off` transposed: `z[i]` holds bytes `8i..8i+8` of every
/// row's, 128-bit lane `L` the rows (0,1), (4,5), (2,3), (6,7).
#[inline(always)]
pub(super) unsafe fn chunk8(x: &[*const u8; 8], off: usize) -> [__m512i; 4] {
    let ld = |r: usize| _mm256_loadu_si256(x[r].add(off) as *const __m256i);
    let pair = |r: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld(r)), ld(r + 4));
    let (p0, p1, p2, p3) = (pair(0), pair(1), pair(2), pair(3)); // [R0,R4], [R1,R5], ...
    let (l01, h01) = (_mm512_unpacklo_epi64(p0, p1), _mm512_unpackhi_epi64(p0, p1));
    let (l23, h23) = (_mm512_unpacklo_epi64(p2, p3), _mm512_unpackhi_epi64(p2, p3));
    [
        _mm512_shuffle_i64x2::<0b10_00_10_00>(l01, l23),
        _mm512_shuffle_i64x2::<0b10_00_10_00>(h01, h23),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(l01, l23),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(h01, h23),
    ]
}

/// Rows `x[0..8]` (super-block 0 of each at `x[r]`) against `NT` tokens: `out[r][t]`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn rows8<const NT: usize, const HIGH: bool>(
    nb: usize,
    x0: [*const u8; 8],
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    // vpermt2w indices: the d (then dmin) of the rows in ORDER; headers of rows 0,4,2,6 are
    // the lanes of the first source, of rows 1,5,3,7 the second's (word index + 32).
    let dd_idx = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        57, 25, 49, 17, 41, 9, 33, 1, 56, 24, 48, 16, 40, 8, 32, 0,
    );
    // Per-lane totals of the min products (dword 0: row of x1, dword 1: row of x2) in ORDER.
    let m_idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
    // Lane pairs' i32 sums (dword 2k of the total in dword 2k) in ORDER.
    let pair_idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
    // vpshufb indices for the scales of sub-block s as i16, 4 lanes a row: bytes s (first row
    // of the 128-bit lane) and 8 + s (second), high bytes zeroed.
    let sc_idx: [__m512i; 8] = std::array::from_fn(|s| {
        let lanes = |b: i64| (0x8000_8000_8000_8000u64 as i64) | b | b << 16 | b << 32 | b << 48;
        let (lo, hi) = (lanes(s as i64), lanes(8 + s as i64));
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    });
    let mut sum = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x: [*const u8; 8] = std::array::from_fn(|r| x0[r].add(ib * block_bytes(HIGH)));
        let ha = lanes4([x[0], x[4], x[2], x[6]]);
        let hb = lanes4([x[1], x[5], x[3], x[7]]);
        let (oa, ob) = (scales_mins(ha), scales_mins(hb));
        // Lane L: the scales (u) / mins (m) of the pair PAIRS[L], 8 bytes a row.
        let u = _mm512_unpacklo_epi64(oa, ob);
        let m = _mm512_unpackhi_epi64(oa, ob);
        let dd = _mm512_permutex2var_epi16(ha, dd_idx, hb);
        let d8 = _mm256_cvtph_ps(_mm512_castsi512_si128(dd));
        let dmin8 = _mm256_cvtph_ps(_mm512_extracti32x4_epi32::<1>(dd));
        // Mins as i16, a row a 128-bit lane: rows 0,1,4,5 and rows 2,3,6,7.
        let m_lo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(m));
        let m_hi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(m));

        // Q5_K: the high bits, bit 2j of byte l for value 64j + l, bit 2j + 1 for 64j + 32 + l.
        let zh = if HIGH {
            chunk8(&x, 16)
        } else {
            [_mm512_setzero_si512(); 4]
        };
        let mut isum = [_mm512_setzero_si512(); NT];
        for j in 0..4 {
            let z = chunk8(&x, qs_at(HIGH) + 32 * j);
            let (sc_lo, sc_hi) = (
                _mm512_shuffle_epi8(u, sc_idx[2 * j]),
                _mm512_shuffle_epi8(u, sc_idx[2 * j + 1]),
            );
            let mut ql: [__m512i; 4] = std::array::from_fn(|i| _mm512_and_si512(z[i], m4));
            let mut qh: [__m512i; 4] =
                std::array::from_fn(|i| _mm512_and_si512(_mm512_srli_epi16::<4>(z[i]), m4));
            if HIGH {
                let (b_lo, b_hi) = (
                    _mm512_set1_epi8((1u8 << (2 * j)) as i8),
                    _mm512_set1_epi8((2u8 << (2 * j)) as i8),
                );
                let sixteen = _mm512_set1_epi8(16);
                for i in 0..4 {
                    let (kl, kh) = (
                        _mm512_test_epi8_mask(zh[i], b_lo),
                        _mm512_test_epi8_mask(zh[i], b_hi),
                    );
                    ql[i] = _mm512_mask_add_epi8(ql[i], kl, ql[i], sixteen);
                    qh[i] = _mm512_mask_add_epi8(qh[i], kh, qh[i], sixteen);
                }
            }
            for (t, isum) in isum.iter_mut().enumerate() {
                let y = a.add(t * stride + ib * Q8K_BYTES + Q8K_QS + 64 * j);
                let bc = |o: usize| _mm512_set1_epi64((y.add(o) as *const i64).read_unaligned());
                // i16 lanes: at most 4 · 2 · 31 · 128 = 31744, no saturation.
                let mut lo = _mm512_maddubs_epi16(ql[0], bc(0));
                let mut hi = _mm512_maddubs_epi16(qh[0], bc(32));
                for i in 1..4 {
                    lo = _mm512_add_epi16(lo, _mm512_maddubs_epi16(ql[i], bc(8 * i)));
                    hi = _mm512_add_epi16(hi, _mm512_maddubs_epi16(qh[i], bc(32 + 8 * i)));
                }
                let p =
                    _mm512_add_epi32(_mm512_madd_epi16(lo, sc_lo), _mm512_madd_epi16(hi, sc_hi));
                *isum = _mm512_add_epi32(*isum, p);
            }
        }
        for t in 0..NT {
            let y = a.add(t * stride + ib * Q8K_BYTES);
            // Two i32 lanes a row: add each to its neighbour, keep the even ones.
            let s = _mm512_add_epi32(isum[t], _mm512_shuffle_epi32::<0b10_11_00_01>(isum[t]));
            let is8 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(pair_idx, s));
            // msum: mins · (pairs of bsums), a row a 128-bit lane, then reduced and gathered.
            let bs = _mm256_loadu_si256(y.add(Q8K_BSUMS) as *const __m256i);
            let bp = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let bp = _mm512_broadcast_i32x4(bp);
            let (x1, x2) = (_mm512_madd_epi16(m_lo, bp), _mm512_madd_epi16(m_hi, bp));
            let v = _mm512_add_epi32(_mm512_unpacklo_epi32(x1, x2), _mm512_unpackhi_epi32(x1, x2));
            let v = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b01_00_11_10>(v));
            let ms8 = _mm512_castsi512_si256(_mm512_permutexvar_epi32(m_idx, v));
            // sum += yd · (d · isum − dmin · msum), as the scalar vec_dot.
            let diff = _mm256_sub_ps(
                _mm256_mul_ps(d8, _mm256_cvtepi32_ps(is8)),
                _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(ms8)),
            );
            let yd = _mm256_set1_ps(f32_at(y));
            sum[t] = _mm256_add_ps(sum[t], _mm256_mul_ps(yd, diff));
        }
    }
    store8(&sum, out);
}

/// Each token's 8 row results (lanes in [`ORDER`]) to `out[r * NT + t]`.
#[inline(always)]
pub(super) unsafe fn store8<const NT: usize>(sum: &[__m256; NT], out: *mut f32) {
    for (t, s) in sum.iter().enumerate() {
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), *s);
        for (k, &r) in ORDER.iter().enumerate() {
            *out.add(r * NT + t) = v[k];
        }
    }
}

/// An eight-row kernel at `NT` tokens: rows `x[0..8]` (block 0 of each at `x[r]`), `nb`
/// blocks, against `NT` activation rows `stride` apart from `a`; row r's result for token t
/// to `out[r * NT + t]`.
pub(super) type Rows8 = unsafe fn(usize, [*const u8; 8], *const u8, usize, *mut f32);

/// A weight type's eight-row kernels and what [`eight_rows`] needs around them.
pub(super) struct EightRows {
    /// Values a weight block holds.
    pub block_values: usize,
    /// Bytes of a weight block.
    pub block_bytes: usize,
    /// Bytes of an activation block.
    pub act_block_bytes: usize,
    /// The kernel at 1, 2, 3 and 4 tokens.
    pub kernels: [Rows8; 4],
    /// The scalar vec_dot, for the rows past the last group of 8: every kernel's rows equal
    /// it bit for bit.
    pub dot: crate::kernels::VecDot,
}

/// A row kernel (see `crate::kernels::RowKernel`) from `k`: rows in groups of 8, the rest
/// through the scalar vec_dot; tokens in groups of up to 4.
#[allow(clippy::too_many_arguments)]
pub(super) fn eight_rows(
    k: &EightRows,
    n: usize,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    a: &[u8],
    stride: usize,
    nt: usize,
    out: &mut [f32],
) {
    let nb = n / k.block_values;
    if rows == 0 || nt == 0 {
        return;
    }
    assert!(
        w.len() >= (rows - 1) * row_bytes + nb * k.block_bytes,
        "weight rows too short"
    );
    assert!(
        a.len() >= (nt - 1) * stride + nb * k.act_block_bytes,
        "activation rows too short"
    );
    assert!(out.len() >= rows * nt, "output too short");
    let groups = rows / 8;
    let mut res = [0f32; 32];
    for g in 0..groups {
        let x: [*const u8; 8] = std::array::from_fn(|r| w[(8 * g + r) * row_bytes..].as_ptr());
        let mut t = 0;
        while t < nt {
            let m = (nt - t).min(4);
            // SAFETY: the rows' nb blocks and the tokens' nb activation blocks lie inside `w`
            // and `a` (checked above), `res` holds 8 x m results; AVX-512 F/BW presence is
            // the module invariant.
            unsafe {
                (k.kernels[m - 1])(nb, x, a[t * stride..].as_ptr(), stride, res.as_mut_ptr())
            };
            for r in 0..8 {
                out[(8 * g + r) * nt + t..][..m].copy_from_slice(&res[r * m..][..m]);
            }
            t += m;
        }
    }
    for r in 8 * groups..rows {
        for t in 0..nt {
            out[r * nt + t] = (k.dot)(n, &w[r * row_bytes..], &a[t * stride..]);
        }
    }
}

/// The `RowKernel` (see `crate::kernels::RowKernel`) of an [`EightRows`] constant.
macro_rules! eight_row_kernel {
    ($spec:path) => {{
        #[allow(clippy::too_many_arguments)]
        fn kernel(
            n: usize,
            w: &[u8],
            rb: usize,
            rows: usize,
            a: &[u8],
            s: usize,
            nt: usize,
            o: &mut [f32],
        ) {
            $crate::kernels::avx512::eight_rows(&$spec, n, w, rb, rows, a, s, nt, o)
        }
        kernel
    }};
}
pub(super) use eight_row_kernel;

const Q4_K: EightRows = EightRows {
    block_values: 256,
    block_bytes: block_bytes(false),
    act_block_bytes: Q8K_BYTES,
    kernels: [
        rows8::<1, false>,
        rows8::<2, false>,
        rows8::<3, false>,
        rows8::<4, false>,
    ],
    dot: scalar::vec_dot_q4_k_q8_k,
};
const Q5_K: EightRows = EightRows {
    block_values: 256,
    block_bytes: block_bytes(true),
    act_block_bytes: Q8K_BYTES,
    kernels: [
        rows8::<1, true>,
        rows8::<2, true>,
        rows8::<3, true>,
        rows8::<4, true>,
    ],
    dot: scalar::vec_dot_q5_k_q8_k,
};

/// Q4_K row kernel (see `crate::kernels::RowKernel`).
pub(crate) const Q4_K_ROWS: RowKernel = eight_row_kernel!(Q4_K);
/// Q5_K row kernel.
pub(crate) const Q5_K_ROWS: RowKernel = eight_row_kernel!(Q5_K);

#[cfg(test)]
mod tests {
    use super::*;

    /// Random bytes as Q4_K/Q5_K blocks of `bb` bytes (d, dmin finite) and as Q8_K activation blocks (qs over the
    /// whole i8 range, -128 included; bsums their sums).
    fn blocks(bb: usize, rows: usize, nb: usize, nt: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut w = vec![0u8; rows * nb * bb];
        for b in w.chunks_exact_mut(bb) {
            for v in b.iter_mut() {
                *v = next() as u8;
            }
            // d, dmin: f16 with exponents in a finite range.
            for o in [0, 2] {
                let h = (next() as u16 & 0x83ff) | ((10 + next() % 8) as u16) << 10;
                b[o..o + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        let mut a = vec![0u8; nt * nb * Q8K_BYTES];
        for b in a.chunks_exact_mut(Q8K_BYTES) {
            b[0..4].copy_from_slice(&(((next() % 2000) as f32 - 1000.0) * 1e-4).to_le_bytes());
            let extreme = next() % 4 == 0;
            for v in b[Q8K_QS..Q8K_BSUMS].iter_mut() {
                *v = if extreme { 0x80 } else { next() as u8 };
            }
            for k in 0..16 {
                let s: i32 = b[Q8K_QS + 16 * k..Q8K_QS + 16 * k + 16]
                    .iter()
                    .map(|&v| v as i8 as i32)
                    .sum();
                b[Q8K_BSUMS + 2 * k..][..2].copy_from_slice(&(s as i16).to_le_bytes());
            }
        }
        // Max scales/nibbles on some blocks.
        for b in w.chunks_exact_mut(bb).step_by(5) {
            b[4..].fill(0xff);
        }
        (w, a)
    }

    #[test]
    fn rows_are_the_scalar_vec_dot_bit_for_bit() {
        if !crate::Isa::Avx512.is_available() {
            eprintln!("no AVX-512 F/BW on this CPU: nothing to check");
            return;
        }
        for (high, bb) in [(false, 144), (true, 176)] {
            let (kernel, dot): (RowKernel, crate::kernels::VecDot) = if high {
                (Q5_K_ROWS, scalar::vec_dot_q5_k_q8_k)
            } else {
                (Q4_K_ROWS, scalar::vec_dot_q4_k_q8_k)
            };
            for (rows, nb, nt, seed) in [(8, 1, 1, 1), (16, 3, 4, 2), (13, 2, 7, 3), (27, 5, 3, 4)]
            {
                let (w, a) = blocks(bb, rows, nb, nt, seed);
                let (row_bytes, n) = (nb * bb, nb * 256);
                let mut out = vec![f32::NAN; rows * nt];
                kernel(n, &w, row_bytes, rows, &a, nb * Q8K_BYTES, nt, &mut out);
                for r in 0..rows {
                    for t in 0..nt {
                        let want = dot(n, &w[r * row_bytes..], &a[t * nb * Q8K_BYTES..]);
                        assert_eq!(
                            out[r * nt + t].to_bits(),
                            want.to_bits(),
                            "{} rows {rows} nb {nb} row {r} token {t}: {} vs {want}",
                            if high { "Q5_K" } else { "Q4_K" },
                            out[r * nt + t]
                        );
                    }
                }
            }
        }
    }
}
