//! Reference K-quant quantizers: `quantize_row_q{2,3,4,5,6,8}_K_ref` of ggml-quants.c,
//! without importance weights.
//!
//! Each function follows the C source statement by statement in f32: the same loop order
//! (so the same accumulation order), the same int↔float conversions (`as i8`/`as u8` where C
//! stores an int into an 8-bit field, which wraps), `nearest_int`'s 1.5·2^23 trick (round
//! half to even), and f16 round trips of `d`/`dmin` before the final requantization. Scale
//! searches (`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`) live in `k_search.rs`.

use half::f16;

use super::k_dequant::{
    get_scale_min_k4, q3k_scale, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
};
use super::k_search::{
    make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, signed_absmax, Qkx2Search,
    GROUP_MAX_EPS,
};
use super::QuantizeBlock;

/// Pack 2-bit quants as Q2_K/Q3_K store them: byte `32h + l` holds `L[128h + l + 32k]` in
/// bits `2k..2k+2`.
fn pack_2bit(ls: &[u8; 256], qs: &mut [u8; 64]) {
    for (h, chunk) in qs.chunks_exact_mut(32).enumerate() {
        let j = 128 * h;
        for (l, q) in chunk.iter_mut().enumerate() {
            *q = ls[j + l] | (ls[j + l + 32] << 2) | (ls[j + l + 64] << 4) | (ls[j + l + 96] << 6);
        }
    }
}

impl QuantizeBlock<256> for BlockQ2K {
    fn quantize(x: &[f32; 256]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let search = Qkx2Search {
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut ls = [0u8; 256];
        let mut laux = [0u8; 16];
        let mut weights = [0.0f32; 16];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let l = &mut ls[16 * j..16 * j + 16];
            (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, l, &mut laux, &search);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let mut y = BlockQ2K {
            scales: [0; 16],
            qs: [0; 64],
            d: f16::ZERO,
            dmin: f16::ZERO,
        };
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (sc, &s) in y.scales.iter_mut().zip(&scales) {
                *sc = nearest_int(iscale * s) as u8;
            }
            y.d = f16::from_f32(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (sc, &m) in y.scales.iter_mut().zip(&mins) {
                *sc |= (nearest_int(iscale * m) << 4) as u8;
            }
            y.dmin = f16::from_f32(max_min / Q4SCALE);
        }
        for j in 0..16 {
            let d = y.d.to_f32() * f32::from(y.scales[j] & 0xf);
            if d == 0.0 {
                continue;
            }
            let dm = y.dmin.to_f32() * f32::from(y.scales[j] >> 4);
            for ii in 0..16 {
                let l = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
                ls[16 * j + ii] = l as u8;
            }
        }
        pack_2bit(&ls, &mut y.qs);
        y
    }
}

impl QuantizeBlock<256> for BlockQ3K {
    fn quantize(x: &[f32; 256]) -> Self {
        let mut ls = [0i8; 256];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut ls[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let mut y = BlockQ3K {
            hmask: [0; 32],
            qs: [0; 64],
            scales: [0; 12],
            d: f16::ZERO,
        };
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // C stores nearest_int(..) into an int8_t before clamping.
                let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    y.scales[j] = l & 0xf;
                } else {
                    y.scales[j - 8] |= (l & 0xf) << 4;
                }
                y.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            y.d = f16::from_f32(1.0 / iscale);
        }
        for j in 0..16 {
            let d = y.d.to_f32() * f32::from(q3k_scale(&y.scales, j));
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                ls[16 * j + ii] = (l + 4) as i8;
            }
        }
        let mut low = [0u8; 256];
        for (j, (&l, lo)) in ls.iter().zip(low.iter_mut()).enumerate() {
            let mut l = l as u8;
            if l > 3 {
                y.hmask[j % 32] |= 1 << (j / 32);
                l -= 4;
            }
            *lo = l;
        }
        pack_2bit(&low, &mut y.qs);
        y
    }
}

/// Shared body of the Q4_K and Q5_K reference quantizers: per 32-element sub-block
/// `make_qkx2_quants`, 6-bit scales/mins packed as [`get_scale_min_k4`] reads them, then
/// requantization against the rounded scales. Returns `(d, dmin, scales, L)`.
fn quantize_qk_minmax(
    x: &[f32; 256],
    nmax: i32,
    search: &Qkx2Search,
) -> (f16, f16, [u8; 12], [u8; 256]) {
    let mut ls = [0u8; 256];
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let l = &mut ls[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, l, &mut laux, search);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let dl = d.to_f32() * f32::from(sc);
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / dl).clamp(0, nmax);
            ls[32 * j + ii] = l as u8;
        }
    }
    (d, dmin, packed, ls)
}

impl QuantizeBlock<256> for BlockQ4K {
    fn quantize(x: &[f32; 256]) -> Self {
        let search = Qkx2Search {
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (d, dmin, scales, ls) = quantize_qk_minmax(x, 15, &search);
        let mut qs = [0u8; 128];
        for (h, chunk) in qs.chunks_exact_mut(32).enumerate() {
            for (l, q) in chunk.iter_mut().enumerate() {
                *q = ls[64 * h + l] | (ls[64 * h + l + 32] << 4);
            }
        }
        BlockQ4K {
            d,
            dmin,
            scales,
            qs,
        }
    }
}

impl QuantizeBlock<256> for BlockQ5K {
    fn quantize(x: &[f32; 256]) -> Self {
        let search = Qkx2Search {
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        let (d, dmin, scales, ls) = quantize_qk_minmax(x, 31, &search);
        let mut qh = [0u8; 32];
        let mut qs = [0u8; 128];
        for (h, chunk) in qs.chunks_exact_mut(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * h), 2u8 << (2 * h));
            for (j, q) in chunk.iter_mut().enumerate() {
                let mut l1 = ls[64 * h + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = ls[64 * h + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                *q = l1 | (l2 << 4);
            }
        }
        BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }
}

impl QuantizeBlock<256> for BlockQ6K {
    fn quantize(x: &[f32; 256]) -> Self {
        let mut ls = [0i8; 256];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ((scale, xs), l) in scales
            .iter_mut()
            .zip(x.chunks_exact(16))
            .zip(ls.chunks_exact_mut(16))
        {
            *scale = make_qx_quants(32, xs, l);
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = *scale;
            }
        }
        let mut y = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: f16::ZERO,
        };
        if max_abs_scale < GROUP_MAX_EPS {
            return y;
        }
        let iscale = -128.0 / max_scale;
        y.d = f16::from_f32(1.0 / iscale);
        for (sc, &s) in y.scales.iter_mut().zip(&scales) {
            *sc = nearest_int(iscale * s).min(127) as i8;
        }
        for j in 0..16 {
            let d = y.d.to_f32() * f32::from(y.scales[j]);
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                ls[16 * j + ii] = (l + 32) as i8;
            }
        }
        let l = |i: usize| ls[i] as u8;
        for n in 0..2 {
            let j = 128 * n;
            for i in 0..32 {
                let (q1, q2, q3, q4) = (l(j + i), l(j + i + 32), l(j + i + 64), l(j + i + 96));
                y.ql[64 * n + i] = (q1 & 0xf) | ((q3 & 0xf) << 4);
                y.ql[64 * n + i + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
                y.qh[32 * n + i] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        y
    }
}

impl QuantizeBlock<256> for BlockQ8K {
    fn quantize(x: &[f32; 256]) -> Self {
        let (max, amax) = signed_absmax(x);
        let mut y = BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        };
        // ggml leaves bsums unwritten for an all-zero block; they are zero here.
        if amax == 0.0 {
            return y;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (bsum, qs) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *bsum = qs.iter().map(|&q| i32::from(q)).sum::<i32>() as i16;
        }
        y.d = 1.0 / iscale;
        y
    }
}
