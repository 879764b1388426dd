//! AVX-512 (F + BW) Q8_0 and Q5_0 row kernels: eight weight rows at a time, each row's result
//! the scalar vec_dot's bit for bit.
//!
//! A row's result is defined by [`scalar::vec_dot_q8_0_q8_0`] (`vec_dot_q5_0_q8_0`): per
//! 32-value block the exact integer sum `isum = Σ w·a`, then `sum += f32(isum)·dw·da` in f32
//! (left to right), blocks in order. The integer sums do not depend on grouping and the f32
//! steps are the same lane by lane, so a row's bits do not depend on which rows or tokens share
//! a call.
//!
//! As in `avx512` (Q4_K), the 8 rows' blocks are transposed in registers so that one 512-bit
//! register holds the same 8 bytes of every row (two i32 lanes a row) and meets one broadcast
//! 8-byte activation load; the weight side (Q8_0's `|w|` and signs, Q5_0's 5-bit values) is
//! unpacked once a block for all the tokens, and a block's f32 steps run for 8 rows in one
//! register.
//!
//! Safety invariant: only reached through [`crate::kernels::row_kernel`] with
//! [`crate::Isa::Avx512`], which `matmul_with` uses only after run-time detection.

use super::scalar;
use crate::act::Q8_0_ACT_BYTES;
use crate::kernels::RowKernel;
use std::arch::x86_64::*;

use super::avx512::{chunk8, eight_row_kernel, lanes4, store8, EightRows};

const Q8_0_BLOCK: usize = 34;
const Q5_0_BLOCK: usize = 22;

/// Lane pairs' i32 sums (dword 2k of the total in dword 2k) in `avx512::ORDER`.
#[inline(always)]
unsafe fn pair_sums(v: __m512i) -> __m256i {
    let idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
    let s = _mm512_add_epi32(v, _mm512_shuffle_epi32::<0b10_11_00_01>(v));
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, s))
}

/// The f16 at offset 0 of each row's block, in `avx512::ORDER`.
#[inline(always)]
unsafe fn scales8(x: &[*const u8; 8]) -> __m256 {
    let h = |r: usize| (x[r] as *const i16).read_unaligned();
    _mm256_cvtph_ps(_mm_set_epi16(
        h(7),
        h(6),
        h(3),
        h(2),
        h(5),
        h(4),
        h(1),
        h(0),
    ))
}

/// `sum += f32(isum)·dw·da`, as the scalar vec_dot.
#[inline(always)]
unsafe fn add_block(sum: &mut __m256, isum: __m512i, dw: __m256, y: *const u8) {
    let da = _mm256_set1_ps((y as *const f32).read_unaligned());
    let p = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(pair_sums(isum)), dw), da);
    *sum = _mm256_add_ps(*sum, p);
}

/// Σ a over the 32 values of activation block `y`.
#[inline(always)]
unsafe fn act_sum(y: *const u8) -> i32 {
    let q = _mm256_loadu_si256(y.add(4) as *const __m256i);
    let s = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
        _mm256_set1_epi16(1),
    );
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The broadcast activation bytes `8i..8i+8` of block `y`.
#[inline(always)]
unsafe fn act8(y: *const u8, i: usize) -> __m512i {
    _mm512_set1_epi64((y.add(4 + 8 * i) as *const i64).read_unaligned())
}

/// Q8_0 rows `x0[0..8]` against `NT` tokens (see `avx512::Rows8`).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q8_0_rows8<const NT: usize>(
    nb: usize,
    x0: [*const u8; 8],
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let ones = _mm512_set1_epi16(1);
    let zero = _mm512_setzero_si512();
    let mut sum = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x: [*const u8; 8] = std::array::from_fn(|r| x0[r].add(ib * Q8_0_BLOCK));
        let dw = scales8(&x);
        let z = chunk8(&x, 2);
        let aw: [__m512i; 4] = std::array::from_fn(|i| _mm512_abs_epi8(z[i]));
        let neg: [__mmask64; 4] = std::array::from_fn(|i| _mm512_movepi8_mask(z[i]));
        for (t, sum) in sum.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8_0_ACT_BYTES);
            let mut isum = zero;
            for i in 0..4 {
                let q = act8(y, i);
                // a·sign(w) (|a| <= 127: no overflow), then |w|·that in i16 pairs (at most
                // 2·128·127, no saturation).
                let qs = _mm512_mask_sub_epi8(q, neg[i], zero, q);
                let p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw[i], qs), ones);
                isum = _mm512_add_epi32(isum, p);
            }
            add_block(sum, isum, dw, y);
        }
    }
    store8(&sum, out);
}

/// Q5_0 rows `x0[0..8]` against `NT` tokens (see `avx512::Rows8`): values `q − 16` with
/// q = nibble | bit << 4, the bits in the block's u32 (bit j for value j).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q5_0_rows8<const NT: usize>(
    nb: usize,
    x0: [*const u8; 8],
    a: *const u8,
    stride: usize,
    out: *mut f32,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let ones16 = _mm512_set1_epi16(1);
    // Bit k of byte k of each row's 8-byte group.
    let bit = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
    let mut sum = [_mm256_setzero_ps(); NT];
    for ib in 0..nb {
        let x: [*const u8; 8] = std::array::from_fn(|r| x0[r].add(ib * Q5_0_BLOCK));
        let dw = scales8(&x);
        // Lanes of rows (0,4,2,6) and (1,5,3,7): [d, qh, qs[0..10]]; and the 16 qs bytes.
        let (ha, hb) = (
            lanes4([x[0], x[4], x[2], x[6]]),
            lanes4([x[1], x[5], x[3], x[7]]),
        );
        let qa = lanes4([x[0].add(6), x[4].add(6), x[2].add(6), x[6].add(6)]);
        let qb = lanes4([x[1].add(6), x[5].add(6), x[3].add(6), x[7].add(6)]);
        // z[i]: qs bytes 8i..8i+8 of every row, lanes the pairs (0,1), (4,5), (2,3), (6,7).
        let z = [_mm512_unpacklo_epi64(qa, qb), _mm512_unpackhi_epi64(qa, qb)];
        // Per lane the pair's qh bytes: [qh_a (4 bytes), qh_b (4 bytes), ...].
        let qh = _mm512_unpacklo_epi32(_mm512_srli_epi64::<16>(ha), _mm512_srli_epi64::<16>(hb));
        // Values 8i..8i+8 (low nibbles, qh byte i) and 16+8i.. (high nibbles, byte 2+i).
        let mut q = [_mm512_setzero_si512(); 4];
        for i in 0..2 {
            for (h, nib) in [
                _mm512_and_si512(z[i], m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(z[i]), m4),
            ]
            .into_iter()
            .enumerate()
            {
                // qh byte 2h + i of the lane's first row (bytes 0..4) and second (4..8).
                let byte = (2 * h + i) as i64;
                let lo = byte * 0x0101_0101_0101_0101;
                let hi = (4 + byte) * 0x0101_0101_0101_0101;
                let spread =
                    _mm512_shuffle_epi8(qh, _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo));
                let k = _mm512_test_epi8_mask(spread, bit);
                q[2 * h + i] = _mm512_mask_add_epi8(nib, k, nib, sixteen);
            }
        }
        for (t, sum) in sum.iter_mut().enumerate() {
            let y = a.add(t * stride + ib * Q8_0_ACT_BYTES);
            // Σ q·a over the block (i16 lanes: at most 4·2·31·127 = 31496), and 16·Σ a.
            let mut p16 = _mm512_setzero_si512();
            for (k, qk) in q.iter().enumerate() {
                // q[k] holds values 8·(k % 2) + 16·(k / 2) + 0..8.
                let off = 8 * (k % 2) + 16 * (k / 2);
                let ya = _mm512_set1_epi64((y.add(4 + off) as *const i64).read_unaligned());
                // u8 q (0..31) by i8 a: at most 2·31·127 a lane.
                p16 = _mm512_add_epi16(p16, _mm512_maddubs_epi16(*qk, ya));
            }
            // Each row's two lanes take 8·Σ a off: Σ (q − 16)·a in their sum.
            let isum = _mm512_sub_epi32(
                _mm512_madd_epi16(p16, ones16),
                _mm512_set1_epi32(8 * act_sum(y)),
            );
            add_block(sum, isum, dw, y);
        }
    }
    store8(&sum, out);
}

const Q8_0: EightRows = EightRows {
    block_values: 32,
    block_bytes: Q8_0_BLOCK,
    act_block_bytes: Q8_0_ACT_BYTES,
    kernels: [
        q8_0_rows8::<1>,
        q8_0_rows8::<2>,
        q8_0_rows8::<3>,
        q8_0_rows8::<4>,
    ],
    dot: scalar::vec_dot_q8_0_q8_0,
};
const Q5_0: EightRows = EightRows {
    block_values: 32,
    block_bytes: Q5_0_BLOCK,
    act_block_bytes: Q8_0_ACT_BYTES,
    kernels: [
        q5_0_rows8::<1>,
        q5_0_rows8::<2>,
        q5_0_rows8::<3>,
        q5_0_rows8::<4>,
    ],
    dot: scalar::vec_dot_q5_0_q8_0,
};

/// Q8_0 row kernel (see `crate::kernels::RowKernel`).
pub(crate) const Q8_0_ROWS: RowKernel = eight_row_kernel!(Q8_0);
/// Q5_0 row kernel.
pub(crate) const Q5_0_ROWS: RowKernel = eight_row_kernel!(Q5_0);

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
        let types: [(&str, RowKernel, crate::kernels::VecDot, usize); 2] = [
            ("Q8_0", Q8_0_ROWS, scalar::vec_dot_q8_0_q8_0, Q8_0_BLOCK),
            ("Q5_0", Q5_0_ROWS, scalar::vec_dot_q5_0_q8_0, Q5_0_BLOCK),
        ];
        for (name, kernel, dot, bb) in types {
            for (rows, nb, nt) in [(8, 1, 1), (16, 3, 4), (13, 2, 7), (27, 5, 3)] {
                // Weight bytes over their whole range (Q8_0: -128 included, every high-bit
                // pattern of Q5_0); activations in -127..=127.
                let mut w = vec![0u8; rows * nb * bb];
                for b in w.chunks_exact_mut(bb) {
                    let h = (next() as u16 & 0x83ff) | ((10 + next() % 8) as u16) << 10;
                    b[..2].copy_from_slice(&h.to_le_bytes());
                    for v in b[2..].iter_mut() {
                        *v = next() as u8;
                    }
                }
                for b in w.chunks_exact_mut(bb).step_by(4) {
                    b[2..].fill(if bb == Q8_0_BLOCK { 0x80 } else { 0xff });
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
                let (row_bytes, n) = (nb * bb, nb * 32);
                let mut out = vec![f32::NAN; rows * nt];
                kernel(
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
                        let want = dot(n, &w[r * row_bytes..], &a[t * nb * Q8_0_ACT_BYTES..]);
                        assert_eq!(
                            out[r * nt + t].to_bits(),
                            want.to_bits(),
                            "{name} rows {rows} nb {nb} row {r} token {t}: {} vs {want}",
                            out[r * nt + t]
                        );
                    }
                }
            }
        }
    }
}
