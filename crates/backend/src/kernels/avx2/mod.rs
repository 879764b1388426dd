//! AVX2 + FMA + F16C kernels.
//!
//! Every kernel computes the dot products of its weight rows with `NT <= 4` activation rows at
//! once, so each weight block is loaded and unpacked once per group of tokens. The integer
//! products of the quantized kernels follow the scalar kernels exactly; only the order of the
//! f32 sums differs. `float` (F32/F16/BF16 rows) and `exact` (quantized rows
//! dequantized in registers against f32 activations) are f32 throughout; `deq` and `act`
//! convert blocks, bit for bit their scalar conversions.
//!
//! Safety invariant: the `#[target_feature]` functions here are only reached through the safe
//! wrappers made by `row_kernel!` and the entry points of `crate::kernels`
//! (`row_kernel`, `f32_act_row_kernel`, `dequantized_tile_kernel`, `dequantize_with`) and
//! `crate::act::quantize_act_row_with`, each of which runs them only at a level above
//! [`crate::Isa::Scalar`] that run-time detection found (every such level has AVX2, FMA and
//! F16C).

#[cfg(target_arch = "x86_64")]
mod act;
#[cfg(target_arch = "x86_64")]
mod deq;
#[cfg(target_arch = "x86_64")]
mod exact;
#[cfg(target_arch = "x86_64")]
mod float;
#[cfg(target_arch = "x86_64")]
mod kquant;
#[cfg(target_arch = "x86_64")]
mod kquant_low;
#[cfg(target_arch = "x86_64")]
mod q8;

#[cfg(target_arch = "x86_64")]
pub(crate) use {
    act::{q8_0_row as q8_0_act_row, q8_k_row as q8_k_act_row},
    deq::dequantize,
    exact::{q4_0_exact_rows, q4_k_exact_rows, q5_0_exact_rows, q8_0_exact_rows},
    float::*,
    kquant::*,
    kquant_low::*,
    q8::*,
};

#[cfg(target_arch = "x86_64")]
pub(crate) mod util {
    use std::arch::x86_64::*;

    /// Horizontal sum of 8 f32 lanes.
    #[inline(always)]
    pub unsafe fn hsum_ps(v: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// Horizontal sum of 4 f32 lanes.
    #[inline(always)]
    pub unsafe fn hsum_ps128(r: __m128) -> f32 {
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// The two f16 in `h` (bits 0..16 and 16..32) as f32 lanes 0 and 1, lanes 2 and 3 zero.
    ///
    /// Written as `vmovd` + `vcvtph2ps` in asm: from intrinsics (`_mm_set1_epi16`,
    /// `_mm_cvtsi32_si128`) LLVM emits `vpinsrw` into whatever register is free, often a live
    /// accumulator, which chains every block on the previous block's FMA (measured 5x slower
    /// on Q8_0; in the Q4_K and Q6_K kernels `d` waited on the min accumulator's FMA).
    /// `vmovd` writes the whole register.
    #[inline(always)]
    unsafe fn cvt_f16x2(h: u32) -> __m128 {
        let v: __m128;
        // SAFETY: register-only instructions of F16C, which every caller's level has.
        std::arch::asm!(
            "vmovd {v}, {h:e}",
            "vcvtph2ps {v}, {v}",
            h = in(reg) h,
            v = out(xmm_reg) v,
            options(pure, nomem, nostack, preserves_flags),
        );
        v
    }

    /// The f16 at `p` as f32.
    #[inline(always)]
    pub unsafe fn f16_at(p: *const u8) -> f32 {
        _mm_cvtss_f32(cvt_f16x2((p as *const u16).read_unaligned() as u32))
    }

    /// The two f16 at `p` (`p[0..2]`, `p[2..4]`) as f32 lanes 0 and 1: one conversion for a
    /// K-quant block's `d` and `dmin`.
    #[inline(always)]
    pub unsafe fn f16x2_at(p: *const u8) -> __m128 {
        cvt_f16x2((p as *const u32).read_unaligned())
    }

    /// Bytes ahead of a weight block that [`prefetch_ahead`] asks for.
    pub const PREFETCH_AHEAD: usize = 2048;

    /// Ask for the `LINES` cache lines from `PREFETCH_AHEAD` bytes past `p` (a block of
    /// weights being read; `LINES` lines cover a block, so a walk over consecutive blocks asks
    /// for every line once or twice). A decode step reads each weight once from DRAM (a
    /// model is larger than the last-level cache), and with the hardware prefetcher alone
    /// one core read Q4_K at ~12 GB/s from DRAM against ~15 from L3 (`matmul_bench`, AMD
    /// EPYC, AVX2); 2 KiB ahead, ~14.5. A prefetch never faults, so the address may lie past
    /// the weights.
    #[inline(always)]
    pub unsafe fn prefetch_ahead<const LINES: usize>(p: *const u8) {
        for l in 0..LINES {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + 64 * l) as *const i8);
        }
    }

    /// The f16 at `p` as f32, broadcast to 8 lanes.
    #[inline(always)]
    pub unsafe fn f16x8_at(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
    }

    /// Half the E8M0 scale `e`: `2^(e - 128)` (see `crate::dequant::e8m0_half`).
    #[inline(always)]
    pub unsafe fn e8m0_half_scale(e: u8) -> f32 {
        crate::dequant::e8m0_half(e)
    }

    /// The f32 at `p`.
    #[inline(always)]
    pub unsafe fn f32_at(p: *const u8) -> f32 {
        (p as *const f32).read_unaligned()
    }

    /// 32 nibbles of 16 bytes: low nibbles in bytes 0..16, high nibbles in bytes 16..32.
    #[inline(always)]
    pub unsafe fn nibbles_32(p: *const u8) -> __m256i {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let both =
            _mm256_insertf128_si256::<1>(_mm256_castsi128_si256(tmp), _mm_srli_epi16::<4>(tmp));
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }

    /// Bytes `8k..8k+8` of `q` (k in 0..4), the 8-byte group a lane-wise conversion takes.
    #[inline(always)]
    pub unsafe fn bytes8(q: __m256i, k: usize) -> __m128i {
        let half = if k < 2 {
            _mm256_castsi256_si128(q)
        } else {
            _mm256_extracti128_si256::<1>(q)
        };
        if k & 1 == 0 {
            half
        } else {
            _mm_srli_si128::<8>(half)
        }
    }

    /// Bytes `8k..8k+8` of `q` (k in 0..4) as signed values in 8 f32 lanes.
    #[inline(always)]
    pub unsafe fn i8_lanes(q: __m256i, k: usize) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes8(q, k)))
    }

    /// Bytes `8k..8k+8` of `q` (k in 0..4) as unsigned values in 8 f32 lanes.
    #[inline(always)]
    pub unsafe fn u8_lanes(q: __m256i, k: usize) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8(q, k)))
    }

    /// 16 pairwise i16 sums of `|x|·sign(y, x)` = `x·y` (both in -127..=127, no saturation).
    #[inline(always)]
    pub unsafe fn mul_i8_pairs_i16(ax: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x))
    }

    /// Sum adjacent i16 pairs into 8 i32 lanes.
    #[inline(always)]
    pub unsafe fn sum_i16_pairs(v: __m256i) -> __m256i {
        _mm256_madd_epi16(v, _mm256_set1_epi16(1))
    }
}

/// Wrap `$inner::<NT>(nb, w, a, stride, out)` as a safe row kernel (see
/// [`crate::kernels::RowKernel`]) that checks the slice sizes once, then walks the rows and,
/// for each, the tokens in groups of 4, then 2, then 1 — all inside one function compiled
/// with the kernel's target features (`$feat`, AVX2 + FMA + F16C unless given), so the
/// per-row calls cost no checks and can be inlined.
macro_rules! row_kernel {
    ($name:ident, $inner:ident, $block:expr, $w_bytes:expr, $a_bytes:expr) => {
        $crate::kernels::avx2::row_kernel!(
            $name,
            $inner,
            $block,
            $w_bytes,
            $a_bytes,
            "avx2,fma,f16c"
        );
    };
    ($name:ident, $inner:ident, $block:expr, $w_bytes:expr, $a_bytes:expr, $feat:literal) => {
        /// Row kernel: `out[r * nt + t] = w_r · a_t` for `rows` weight rows `row_bytes` apart
        /// and `nt` activation rows `stride` apart.
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
            let nb = n / $block;
            if rows == 0 || nt == 0 {
                return;
            }
            assert!(
                w.len() >= (rows - 1) * row_bytes + nb * $w_bytes,
                "weight rows too short"
            );
            assert!(
                a.len() >= (nt - 1) * stride + nb * $a_bytes,
                "activation rows too short"
            );
            assert!(out.len() >= rows * nt, "output too short");

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $feat)]
            unsafe fn each_row(
                nb: usize,
                w: *const u8,
                row_bytes: usize,
                rows: usize,
                a: *const u8,
                stride: usize,
                nt: usize,
                out: *mut f32,
            ) {
                for r in 0..rows {
                    let (w, out) = (w.add(r * row_bytes), out.add(r * nt));
                    let mut t = 0;
                    while t + 4 <= nt {
                        $inner::<4>(nb, w, a.add(t * stride), stride, out.add(t));
                        t += 4;
                    }
                    if t + 2 <= nt {
                        $inner::<2>(nb, w, a.add(t * stride), stride, out.add(t));
                        t += 2;
                    }
                    if t < nt {
                        $inner::<1>(nb, w, a.add(t * stride), stride, out.add(t));
                    }
                }
            }
            // SAFETY: sizes checked above; the target features are the module invariant.
            unsafe {
                each_row(
                    nb,
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
pub(crate) use row_kernel;
