//! Dot-product kernels and their dispatch.
//!
//! A *row kernel* computes `out[r, t] = Σ_c W[r, c] · A[t, c]` for a few weight rows (bytes of
//! their ggml blocks, `row_bytes` apart) and a few activation rows laid `stride` bytes apart,
//! each already in the weight's [`ActType`](crate::ActType) (see `RowKernel`).
//! `row_kernel` picks the implementation for a weight type and an instruction-set level:
//! the AVX-512 or AVX2 kernels where they exist, else the scalar vec_dot of [`scalar`]
//! applied row by row and token by token.

pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_q8;
pub mod scalar;

use crate::isa::Isa;
use mlaserve_gguf::GgmlType;

/// `fn(n_cols, weight_rows, row_bytes, n_rows, act_rows, act_stride, n_tokens, out)`:
/// `out[r * n_tokens + t] = Σ_c W[r, c] · A[t, c]` over `n_cols` columns, weight row r at byte
/// `r * row_bytes` of `weight_rows`, activation row t at byte `t * act_stride`.
pub(crate) type RowKernel = fn(usize, &[u8], usize, usize, &[u8], usize, usize, &mut [f32]);

/// A scalar vec_dot: `fn(n_cols, weight_row, act_row) -> dot`.
pub type VecDot = fn(usize, &[u8], &[u8]) -> f32;

/// The scalar vec_dot of a weight type, or `None` if the type is unsupported.
pub fn scalar_vec_dot(ty: GgmlType) -> Option<VecDot> {
    use GgmlType::*;
    Some(match ty {
        F32 => scalar::vec_dot_f32,
        F16 => scalar::vec_dot_f16,
        BF16 => scalar::vec_dot_bf16,
        Q4_0 => scalar::vec_dot_q4_0_q8_0,
        Q4_1 => scalar::vec_dot_q4_1_q8_1,
        Q5_0 => scalar::vec_dot_q5_0_q8_0,
        Q5_1 => scalar::vec_dot_q5_1_q8_1,
        Q8_0 => scalar::vec_dot_q8_0_q8_0,
        Q2_K => scalar::vec_dot_q2_k_q8_k,
        Q3_K => scalar::vec_dot_q3_k_q8_k,
        Q4_K => scalar::vec_dot_q4_k_q8_k,
        Q5_K => scalar::vec_dot_q5_k_q8_k,
        Q6_K => scalar::vec_dot_q6_k_q8_k,
        Q8_K => scalar::vec_dot_q8_k_q8_k,
        IQ4_NL => scalar::vec_dot_iq4_nl_q8_0,
        IQ4_XS => scalar::vec_dot_iq4_xs_q8_k,
        MXFP4 => scalar::vec_dot_mxfp4_q8_0,
        _ => return None,
    })
}

/// Scalar row kernels: a vec_dot applied to each (weight row, activation row) in turn.
macro_rules! scalar_row_kernels {
    ($($ty:ident => $name:ident = $f:path),* $(,)?) => {
        $(
            #[allow(clippy::too_many_arguments)]
            fn $name(
                n: usize,
                w: &[u8],
                row_bytes: usize,
                rows: usize,
                a: &[u8],
                stride: usize,
                nt: usize,
                out: &mut [f32],
            ) {
                for r in 0..rows {
                    for t in 0..nt {
                        out[r * nt + t] = $f(n, &w[r * row_bytes..], &a[t * stride..]);
                    }
                }
            }
        )*
        fn scalar_row_kernel(ty: GgmlType) -> Option<RowKernel> {
            match ty {
                $(GgmlType::$ty => Some($name),)*
                _ => None,
            }
        }
    };
}

scalar_row_kernels! {
    F32 => rows_f32 = scalar::vec_dot_f32,
    F16 => rows_f16 = scalar::vec_dot_f16,
    BF16 => rows_bf16 = scalar::vec_dot_bf16,
    Q4_0 => rows_q4_0 = scalar::vec_dot_q4_0_q8_0,
    Q4_1 => rows_q4_1 = scalar::vec_dot_q4_1_q8_1,
    Q5_0 => rows_q5_0 = scalar::vec_dot_q5_0_q8_0,
    Q5_1 => rows_q5_1 = scalar::vec_dot_q5_1_q8_1,
    Q8_0 => rows_q8_0 = scalar::vec_dot_q8_0_q8_0,
    Q2_K => rows_q2_k = scalar::vec_dot_q2_k_q8_k,
    Q3_K => rows_q3_k = scalar::vec_dot_q3_k_q8_k,
    Q4_K => rows_q4_k = scalar::vec_dot_q4_k_q8_k,
    Q5_K => rows_q5_k = scalar::vec_dot_q5_k_q8_k,
    Q6_K => rows_q6_k = scalar::vec_dot_q6_k_q8_k,
    Q8_K => rows_q8_k = scalar::vec_dot_q8_k_q8_k,
    IQ4_NL => rows_iq4_nl = scalar::vec_dot_iq4_nl_q8_0,
    IQ4_XS => rows_iq4_xs = scalar::vec_dot_iq4_xs_q8_k,
    MXFP4 => rows_mxfp4 = scalar::vec_dot_mxfp4_q8_0,
}

/// A row kernel for weight type `ty` against unrounded f32 activation rows (the layout of
/// [`crate::ActType::F32`]), or `None` where `ty` has none at level `isa` (then the caller
/// dequantizes and uses the F32 kernel). F16 and BF16 weights always have one: their kernels
/// widen the weights and take f32 rows.
///
/// The caller guarantees that `isa` is supported by the running CPU.
pub(crate) fn f32_act_row_kernel(ty: GgmlType, isa: Isa) -> Option<RowKernel> {
    use GgmlType::*;
    if matches!(ty, F32 | F16 | BF16) {
        return row_kernel(ty, isa);
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        return match ty {
            Q8_0 => Some(avx2::q8_0_exact_rows),
            Q4_0 => Some(avx2::q4_0_exact_rows),
            Q5_0 => Some(avx2::q5_0_exact_rows),
            Q4_K => Some(avx2::q4_k_exact_rows),
            _ => None,
        };
    }
    let _ = isa;
    None
}

/// The F32 row kernel for dequantized tiles at level `isa`, adding in the order of the
/// register-dequantizing kernels of [`f32_act_row_kernel`] (two chains alternating every 8
/// columns), so a token's result does not depend on how many tokens share its call.
///
/// The caller guarantees that `isa` is supported by the running CPU.
pub(crate) fn dequantized_tile_kernel(isa: Isa) -> RowKernel {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        return avx2::f32_rows;
    }
    let _ = isa;
    scalar_row_kernel(GgmlType::F32).expect("F32 has a scalar kernel")
}

/// Dequantize the whole blocks of `src` (type `ty`) into `out` (`out.len()` a multiple of the
/// block size) at level `isa`: the same f32 values at every level.
///
/// The caller guarantees that `isa` is supported by the running CPU.
pub(crate) fn dequantize_with(isa: Isa, ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let nb = out.len() / ty.block_size();
    assert!(
        src.len() >= nb * ty.type_size(),
        "dequantize: source too short"
    );
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        // SAFETY: every level above Scalar has AVX2/FMA/F16C (checked); the source holds the
        // blocks (checked above).
        if unsafe { avx2::dequantize(ty, src, out) } {
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    crate::dequant::dequantize_row_unchecked(ty, &src[..nb * ty.type_size()], out);
}

/// The row kernel for weight type `ty` at level `isa`, or `None` if `ty` is unsupported.
///
/// The caller guarantees that `isa` is supported by the running CPU (see [`Isa::available`]).
pub(crate) fn row_kernel(ty: GgmlType, isa: Isa) -> Option<RowKernel> {
    use GgmlType::*;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        match ty {
            Q4_K => return Some(avx512::Q4_K_ROWS),
            Q5_K => return Some(avx512::Q5_K_ROWS),
            Q8_0 => return Some(avx512_q8::Q8_0_ROWS),
            Q5_0 => return Some(avx512_q8::Q5_0_ROWS),
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        let k: Option<RowKernel> = match ty {
            F32 => Some(avx2::f32_rows),
            F16 => Some(avx2::f16_rows),
            BF16 => Some(avx2::bf16_rows),
            Q8_0 => Some(avx2::q8_0_rows),
            Q4_0 => Some(avx2::q4_0_rows),
            Q4_1 => Some(avx2::q4_1_rows),
            Q5_0 => Some(avx2::q5_0_rows),
            Q5_1 => Some(avx2::q5_1_rows),
            IQ4_NL => Some(avx2::iq4_nl_rows),
            MXFP4 => Some(avx2::mxfp4_rows),
            Q2_K => Some(avx2::q2_k_rows),
            Q3_K => Some(avx2::q3_k_rows),
            Q4_K => Some(avx2::q4_k_rows),
            Q5_K => Some(avx2::q5_k_rows),
            Q6_K => Some(avx2::q6_k_rows),
            IQ4_XS => Some(avx2::iq4_xs_rows),
            _ => None,
        };
        if k.is_some() {
            return k;
        }
    }
    let _ = isa;
    scalar_row_kernel(ty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QMatrix;

    #[test]
    fn dequantize_is_the_same_values_at_every_level() {
        use GgmlType::*;
        let (rows, cols) = (7, 1024);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 1.3e-3 * (1 + i % 5) as f32)
            .collect();
        for ty in [F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q6_K, Q5_K, IQ4_NL] {
            let m = QMatrix::quantize_from_f32(ty, rows, cols, &x).unwrap();
            let want = m.to_f32();
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; rows * cols];
                for r in 0..rows {
                    // Whole row, and a chunk starting past the first block.
                    dequantize_with(isa, ty, m.row(r), &mut got[r * cols..(r + 1) * cols]);
                }
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} at {isa:?}");
                let (bs, ts) = (ty.block_size(), ty.type_size());
                let k0 = if bs == 1 { 9 } else { bs };
                let mut part = vec![0f32; cols - k0 - bs.max(8)];
                let n = part.len() / bs * bs;
                dequantize_with(isa, ty, &m.row(2)[k0 / bs * ts..], &mut part[..n]);
                assert_eq!(
                    &part[..n],
                    &want[2 * cols + k0..2 * cols + k0 + n],
                    "{ty} chunk"
                );
            }
        }
    }
}
