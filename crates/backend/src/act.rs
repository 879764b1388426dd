//! Activation rows converted to a weight type's *vec_dot type*, as llama.cpp does before a
//! matmul.
//!
//! Layouts (little-endian, blocks back to back, `row_bytes(n)` bytes for `n` values):
//! - `F32`, `F16`, `BF16`: f32 arrays; for `F16`/`BF16` every value is first rounded (to
//!   nearest even) to that type, so the kernels see exactly llama.cpp's converted activations
//!   without converting them again per weight row.
//! - `Q8_0`: `d: f32 | qs: [i8; 32]` (36 bytes); `x ≈ d·q`. `d` is rounded to f16 as in
//!   ggml's `block_q8_0` but stored widened, so kernels broadcast it with a plain load.
//! - `Q8_1`: `d: f32 | s: f32 | qs: [i8; 32]` (40 bytes) with `s = d·Σq`. ggml stores `d`
//!   and `s` as f16; keeping them in f32 makes the Q4_1/Q5_1 min term exact, nothing else
//!   changes.
//! - `Q8_K`: ggml's `block_q8_K` — `d: f32 | qs: [i8; 256] | bsums: [i16; 16]` (292 bytes),
//!   `bsums[j] = Σ qs[16j..16j+16]`.
//!
//! Invariant: every quantized value lies in -127..=127 (so `-q` never overflows an i8).

use crate::isa::Isa;
use mlaserve_gguf::{GgmlType, QK_K};

/// The type an activation row is converted to before it meets a weight row.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActType {
    /// f32, unchanged.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32-value blocks, one f16 scale.
    Q8_0,
    /// 32-value blocks, an f32 scale and the f32 scaled sum.
    Q8_1,
    /// 256-value blocks, an f32 scale and 16 partial sums.
    Q8_K,
}

/// Bytes of one `Q8_0` activation block.
pub(crate) const Q8_0_ACT_BYTES: usize = 36;
/// Bytes of one `Q8_1` activation block.
pub(crate) const Q8_1_ACT_BYTES: usize = 40;

impl ActType {
    /// The vec_dot type llama.cpp pairs with weight type `ty`, or `None` if unsupported.
    pub fn for_weight(ty: GgmlType) -> Option<ActType> {
        use GgmlType::*;
        Some(match ty {
            F32 => ActType::F32,
            F16 => ActType::F16,
            BF16 => ActType::BF16,
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => ActType::Q8_0,
            Q4_1 | Q5_1 => ActType::Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ4_XS => ActType::Q8_K,
            _ => return None,
        })
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        match self {
            ActType::F32 | ActType::F16 | ActType::BF16 => 1,
            ActType::Q8_0 | ActType::Q8_1 => 32,
            ActType::Q8_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            ActType::F32 | ActType::F16 | ActType::BF16 => 4,
            ActType::Q8_0 => Q8_0_ACT_BYTES,
            ActType::Q8_1 => Q8_1_ACT_BYTES,
            ActType::Q8_K => 292,
        }
    }

    /// Bytes of a row of `n` values (`n` a multiple of [`ActType::block_size`]).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }
}

/// Convert `x` (one activation row) to `act`, writing `act.row_bytes(x.len())` bytes to `out`.
///
/// # Panics
/// If `x.len()` is not a multiple of the block size or `out` has the wrong length (internal
/// callers size both from the weight matrix).
pub fn quantize_act_row(act: ActType, x: &[f32], out: &mut [u8]) {
    quantize_act_row_with(Isa::detect(), act, x, out)
}

/// [`quantize_act_row`] at instruction-set level `isa` (a level this CPU lacks falls back to
/// [`Isa::Scalar`]). Every level writes the same bytes: the SIMD conversions repeat the
/// scalar one's f32 operations lane by lane.
///
/// # Panics
/// As [`quantize_act_row`].
pub fn quantize_act_row_with(isa: Isa, act: ActType, x: &[f32], out: &mut [u8]) {
    assert_eq!(
        x.len() % act.block_size(),
        0,
        "activation row length vs block size"
    );
    assert_eq!(
        out.len(),
        act.row_bytes(x.len()),
        "activation buffer length"
    );
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && isa.is_available() {
        // SAFETY: AVX2/FMA/F16C are present (every level above Scalar has them); the
        // lengths were checked above.
        match act {
            ActType::Q8_0 => return unsafe { crate::kernels::avx2::q8_0_act_row(x, out) },
            ActType::Q8_K => return unsafe { crate::kernels::avx2::q8_k_act_row(x, out) },
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    match act {
        ActType::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        ActType::F16 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_f32().to_le_bytes());
            }
        }
        ActType::BF16 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_f32().to_le_bytes());
            }
        }
        ActType::Q8_0 => {
            for (o, xb) in out.chunks_exact_mut(Q8_0_ACT_BYTES).zip(x.chunks_exact(32)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                o[0..4].copy_from_slice(&half::f16::from_f32(d).to_f32().to_le_bytes());
                for (q, v) in o[4..].iter_mut().zip(xb) {
                    *q = (v * id).round().clamp(-127.0, 127.0) as i8 as u8;
                }
            }
        }
        ActType::Q8_1 => {
            for (o, xb) in out.chunks_exact_mut(Q8_1_ACT_BYTES).zip(x.chunks_exact(32)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let mut sum = 0i32;
                for (q, v) in o[8..].iter_mut().zip(xb) {
                    let qi = (v * id).round().clamp(-127.0, 127.0) as i8;
                    sum += qi as i32;
                    *q = qi as u8;
                }
                o[0..4].copy_from_slice(&d.to_le_bytes());
                o[4..8].copy_from_slice(&(d * sum as f32).to_le_bytes());
            }
        }
        ActType::Q8_K => {
            for (o, xb) in out.chunks_exact_mut(292).zip(x.chunks_exact(QK_K)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                o[0..4].copy_from_slice(&d.to_le_bytes());
                let (qs, bsums) = o[4..].split_at_mut(QK_K);
                for (g, (qg, xg)) in qs.chunks_exact_mut(16).zip(xb.chunks_exact(16)).enumerate() {
                    let mut s = 0i16;
                    for (q, v) in qg.iter_mut().zip(xg) {
                        let qi = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
                        s += qi as i16;
                        *q = qi as u8;
                    }
                    bsums[2 * g..2 * g + 2].copy_from_slice(&s.to_le_bytes());
                }
            }
        }
    }
}

/// Dequantize an activation row (the exact values the kernels multiply): for tests.
pub fn dequantize_act_row(act: ActType, src: &[u8], out: &mut [f32]) {
    use crate::dequant::f32_at;
    match act {
        ActType::F32 | ActType::F16 | ActType::BF16 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32_at(b, 0);
            }
        }
        ActType::Q8_0 | ActType::Q8_1 | ActType::Q8_K => {
            let (bs, bb) = (act.block_size(), act.block_bytes());
            for (o, b) in out.chunks_exact_mut(bs).zip(src.chunks_exact(bb)) {
                let (d, qs) = match act {
                    ActType::Q8_0 => (f32_at(b, 0), &b[4..Q8_0_ACT_BYTES]),
                    ActType::Q8_1 => (f32_at(b, 0), &b[8..40]),
                    _ => (f32_at(b, 0), &b[4..4 + QK_K]),
                };
                for (v, q) in o.iter_mut().zip(qs) {
                    *v = d * (*q as i8) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_k_bsums_and_range() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.13)
            .collect();
        let mut buf = vec![0u8; ActType::Q8_K.row_bytes(512)];
        quantize_act_row(ActType::Q8_K, &x, &mut buf);
        for blk in buf.chunks_exact(292) {
            let qs = &blk[4..260];
            assert!(qs.iter().all(|&q| q as i8 != -128));
            for g in 0..16 {
                let s: i32 = qs[16 * g..16 * g + 16]
                    .iter()
                    .map(|&q| q as i8 as i32)
                    .sum();
                let b = i16::from_le_bytes([blk[260 + 2 * g], blk[261 + 2 * g]]);
                assert_eq!(s, b as i32);
            }
        }
        let mut back = vec![0f32; 512];
        dequantize_act_row(ActType::Q8_K, &buf, &mut back);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= amax / 127.0 * 0.5 + 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn q8_1_sum_matches_values() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut buf = vec![0u8; ActType::Q8_1.row_bytes(64)];
        quantize_act_row(ActType::Q8_1, &x, &mut buf);
        let mut back = vec![0f32; 64];
        dequantize_act_row(ActType::Q8_1, &buf, &mut back);
        for (b, blk) in back.chunks_exact(32).zip(buf.chunks_exact(Q8_1_ACT_BYTES)) {
            let s = f32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
            let sum: f32 = b.iter().sum();
            assert!((s - sum).abs() < 1e-5, "{s} vs {sum}");
        }
    }

    /// Rows that probe every branch of the conversions: random magnitudes over many
    /// binades, exact halves after scaling (d a power of two), zeros, denormal-only blocks,
    /// ±inf and NaN lanes.
    fn awkward_rows() -> Vec<Vec<f32>> {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut rows = Vec::new();
        for case in 0..200 {
            let mut x: Vec<f32> = (0..512)
                .map(|_| {
                    let r = next();
                    let mag = f32::from_bits(((r >> 32) as u32 & 0x007f_ffff) | 0x3f80_0000) - 1.0;
                    let e = ((r >> 8) % 40) as i32 - 20;
                    let v = mag * 2f32.powi(e);
                    if r & 1 == 1 {
                        -v
                    } else {
                        v
                    }
                })
                .collect();
            match case % 5 {
                // amax 127/8: d = 1/8 exactly, so (k + 0.5)/8 scales to an exact half.
                0 => {
                    for (i, v) in x.iter_mut().enumerate() {
                        let k = (next() % 254) as f32 - 127.0;
                        *v = if i % 32 == 0 {
                            127.0 / 8.0
                        } else {
                            (k + 0.5) / 8.0
                        };
                    }
                }
                1 => x[..256].fill(0.0),
                2 => x.iter_mut().for_each(|v| *v *= 1e-38),
                3 => {
                    x[3] = f32::NAN;
                    x[40] = f32::INFINITY;
                    x[300] = f32::NEG_INFINITY;
                    x[301] = f32::NAN;
                }
                _ => {}
            }
            rows.push(x);
        }
        rows
    }

    #[test]
    fn simd_conversion_is_the_scalar_bytes() {
        for isa in Isa::available() {
            for act in [ActType::Q8_0, ActType::Q8_K] {
                for x in awkward_rows() {
                    let mut want = vec![0u8; act.row_bytes(x.len())];
                    let mut got = vec![0xAAu8; act.row_bytes(x.len())];
                    quantize_act_row_with(Isa::Scalar, act, &x, &mut want);
                    quantize_act_row_with(isa, act, &x, &mut got);
                    assert_eq!(got, want, "{isa:?} {act:?}");
                }
            }
        }
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let x = vec![0f32; 32];
        let mut buf = vec![0xAAu8; Q8_0_ACT_BYTES];
        quantize_act_row(ActType::Q8_0, &x, &mut buf);
        assert!(buf.iter().all(|&b| b == 0));
    }
}
