//! Scale searches shared by the K-quant reference quantizers, with ggml-quants.c's names:
//! `nearest_int`, `make_qx_quants` (symmetric, x²-weighted), `make_q3_quants` (symmetric
//! with per-quant refinement) and `make_qkx2_quants` (asymmetric with a min, weighted least
//! squares over trial scales). Each mirrors the C statement by statement in f32, so the
//! accumulation order, and with it every rounding, is the same.

/// ggml's `GROUP_MAX_EPS`: groups with a smaller max magnitude count as all-zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, exact for |x| ≤ 2^22 (beyond that
/// it returns the same wrapped garbage as the C version, which only asserts in debug).
#[inline]
pub(super) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// The element with the largest magnitude (first on ties), via `ax > amax`.
#[inline]
pub(super) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`: symmetric quants in
/// `0..2·nmax` (stored biased by `nmax`) minimizing the x²-weighted error; returns the scale.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], ls: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        ls.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l_out, &v) in ls.iter_mut().zip(x) {
        let l = quant(iscale, v);
        *l_out = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = quant(iscale, v);
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l_out, &v) in ls.iter_mut().zip(x) {
                *l_out = (nmax + quant(iscale, v)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: like [`make_qx_quants`] but refines the
/// quants one at a time (up to 5 passes); quants are stored biased by `nmax`.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], ls: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        ls.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l_out, &v) in ls.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l_out = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (l_i, &v) in ls.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*l_i);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*l_i) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l_i = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in ls.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of the scale search of [`make_qkx2_quants`].
pub(super) struct Qkx2Search {
    pub(super) rmin: f32,
    pub(super) rdelta: f32,
    pub(super) nstep: i32,
    pub(super) use_mad: bool,
}

/// `make_qkx2_quants`: asymmetric quants in `0..=nmax` with a min, weighted least squares
/// over `nstep + 1` trial scales. Returns `(scale, the_min)` where value ≈ `scale·q − the_min`.
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    ls: &mut [u8],
    laux: &mut [u8],
    p: &Qkx2Search,
) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        ls.fill(0);
        return (0.0, -min);
    }
    let error = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((l_out, &v), &w) in ls.iter_mut().zip(x).zip(weights) {
        let l = nearest_int(iscale * (v - min)).clamp(0, nmax);
        *l_out = l as u8;
        let diff = scale * l as f32 + min - v;
        best_error += w * error(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((l_out, &v), &w) in laux.iter_mut().zip(x).zip(weights) {
            let l = nearest_int(iscale * (v - min)).clamp(0, nmax);
            *l_out = l as u8;
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for ((&l, &v), &w) in laux.iter().zip(x).zip(weights) {
                let diff = this_scale * f32::from(l) + this_min - v;
                cur_error += w * error(diff);
            }
            if cur_error < best_error {
                ls.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::nearest_int;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }
}
