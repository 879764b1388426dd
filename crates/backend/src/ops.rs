//! Small f32 helpers of a transformer layer. `dot_f32` and `axpy` use AVX2+FMA when present.

/// RMS norm over each row of `n` values of `x` (`[T, n]`), in place, times `weight` (`[n]`):
/// `x = x / sqrt(mean(x²) + eps) · weight`.
///
/// # Panics
/// If `weight.len() != n` or `x.len()` is not a multiple of `n`.
pub fn rms_norm(x: &mut [f32], n: usize, weight: &[f32], eps: f32) {
    assert_eq!(weight.len(), n, "rms_norm: weight length vs n");
    if n == 0 {
        return;
    }
    assert_eq!(
        x.len() % n,
        0,
        "rms_norm: x length {} is not a multiple of n = {n}",
        x.len()
    );
    for row in x.chunks_exact_mut(n) {
        let ss = dot_f32(row, row) as f64 / n as f64;
        let scale = (1.0 / (ss + eps as f64).sqrt()) as f32;
        for (v, g) in row.iter_mut().zip(weight) {
            *v *= scale * g;
        }
    }
}

/// Softmax of `x` in place (max-subtracted; an all `-inf` row becomes all zeros).
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `gate = silu(gate) · up`, elementwise; `silu(g) = g / (1 + e^-g)`.
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: gate and up lengths differ");
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `Σ a·b`.
///
/// # Panics
/// If the lengths differ.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx2.is_available() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { simd::dot(a, b) };
    }
    let mut acc = [0f32; 8];
    for (ca, cb) in a.chunks(8).zip(b.chunks(8)) {
        for (k, (x, y)) in ca.iter().zip(cb).enumerate() {
            acc[k] += x * y;
        }
    }
    acc.iter().sum()
}

/// `y += a·x`.
///
/// # Panics
/// If the lengths differ.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx2.is_available() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { simd::axpy(y, a, x) };
    }
    for (v, u) in y.iter_mut().zip(x) {
        *v += a * u;
    }
}

/// Several [`axpy`] sequences sharing their x rows: `ys` holds `a.len()` (at most 4) rows of
/// `d`, and row b becomes `Σ_{j < a[b].len()} a[b][j] · x_j`, `x_j = x[off + j·stride..][..d]`,
/// computed bit for bit as `a[b].len()` successive `axpy(row b, a[b][j], x_j)` calls on a
/// zeroed row. Each x row is loaded once for all rows (attention's value sums of a block of
/// queries).
///
/// # Panics
/// If more than 4 rows are asked for, `ys` is not `a.len() * d` long, or an x row needed lies
/// outside `x`.
pub fn axpy_rows(ys: &mut [f32], d: usize, a: &[&[f32]], x: &[f32], off: usize, stride: usize) {
    assert!(a.len() <= 4, "axpy_rows: {} rows, at most 4", a.len());
    assert_eq!(ys.len(), a.len() * d, "axpy_rows: output length");
    let n = a.iter().map(|r| r.len()).max().unwrap_or(0);
    if n > 0 {
        assert!(
            off + (n - 1) * stride + d <= x.len(),
            "axpy_rows: x rows outside x"
        );
    }
    ys.fill(0.0);
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::Avx2.is_available() {
        // SAFETY: AVX2 and FMA were detected at run time; the x rows lie inside x (checked).
        return unsafe { simd::axpy_rows(ys, d, a, x, off, stride) };
    }
    for (b, ab) in a.iter().enumerate() {
        for (j, &w) in ab.iter().enumerate() {
            axpy(&mut ys[b * d..(b + 1) * d], w, &x[off + j * stride..][..d]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use crate::kernels::avx2::util::hsum_ps;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let j = i + 8 * k;
                *acc =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(j)), _mm256_loadu_ps(pb.add(j)), *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = hsum_ps(s);
        for j in i..n {
            sum += a[j] * b[j];
        }
        sum
    }

    /// See [`super::axpy_rows`]: each 16-lane slice of the rows accumulates over every j in
    /// registers, by the same FMA per element as `axpy`; the tail past the last multiple of
    /// 8 by `axpy`'s scalar `y += a * x`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_rows(
        ys: &mut [f32],
        d: usize,
        a: &[&[f32]],
        x: &[f32],
        off: usize,
        stride: usize,
    ) {
        match a.len() {
            0 => {}
            1 => rows_nb::<1>(ys, d, a, x, off, stride),
            2 => rows_nb::<2>(ys, d, a, x, off, stride),
            3 => rows_nb::<3>(ys, d, a, x, off, stride),
            _ => rows_nb::<4>(ys, d, a, x, off, stride),
        }
    }

    /// `NB` rows: the accumulators are registers (`NB` x 2 x 8 lanes).
    #[allow(clippy::needless_range_loop)] // b indexes w, len and acc alike
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_nb<const NB: usize>(
        ys: &mut [f32],
        d: usize,
        a: &[&[f32]],
        x: &[f32],
        off: usize,
        stride: usize,
    ) {
        let w: [*const f32; NB] = std::array::from_fn(|b| a[b].as_ptr());
        let len: [usize; NB] = std::array::from_fn(|b| a[b].len());
        let (lo, hi) = (
            len.iter().copied().min().unwrap_or(0),
            len.iter().copied().max().unwrap_or(0),
        );
        let px = x.as_ptr().add(off);
        let py = ys.as_mut_ptr();
        let d8 = d / 8 * 8;
        let mut s = 0;
        while s + 16 <= d8 {
            let mut acc = [[_mm256_setzero_ps(); 2]; NB];
            // Keys every row takes, then the rows still going.
            for j in 0..lo {
                let xj = px.add(j * stride + s);
                let (x0, x1) = (_mm256_loadu_ps(xj), _mm256_loadu_ps(xj.add(8)));
                for b in 0..NB {
                    let wb = _mm256_set1_ps(*w[b].add(j));
                    acc[b][0] = _mm256_fmadd_ps(wb, x0, acc[b][0]);
                    acc[b][1] = _mm256_fmadd_ps(wb, x1, acc[b][1]);
                }
            }
            for j in lo..hi {
                let xj = px.add(j * stride + s);
                let (x0, x1) = (_mm256_loadu_ps(xj), _mm256_loadu_ps(xj.add(8)));
                for b in 0..NB {
                    if j < len[b] {
                        let wb = _mm256_set1_ps(*w[b].add(j));
                        acc[b][0] = _mm256_fmadd_ps(wb, x0, acc[b][0]);
                        acc[b][1] = _mm256_fmadd_ps(wb, x1, acc[b][1]);
                    }
                }
            }
            for b in 0..NB {
                _mm256_storeu_ps(py.add(b * d + s), acc[b][0]);
                _mm256_storeu_ps(py.add(b * d + s + 8), acc[b][1]);
            }
            s += 16;
        }
        if s < d8 {
            // One 8-lane slice left.
            let mut acc = [_mm256_setzero_ps(); NB];
            for j in 0..hi {
                let x0 = _mm256_loadu_ps(px.add(j * stride + s));
                for b in 0..NB {
                    if j < len[b] {
                        acc[b] = _mm256_fmadd_ps(_mm256_set1_ps(*w[b].add(j)), x0, acc[b]);
                    }
                }
            }
            for b in 0..NB {
                _mm256_storeu_ps(py.add(b * d + s), acc[b]);
            }
        }
        for b in 0..NB {
            for j in 0..len[b] {
                for i in d8..d {
                    *py.add(b * d + i) += *w[b].add(j) * *px.add(j * stride + i);
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
            _mm256_storeu_ps(py.add(i), v);
            i += 8;
        }
        for j in i..n {
            y[j] += a * x[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let mut x: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let orig = x.clone();
        let w: Vec<f32> = (0..8).map(|i| 1.0 + i as f32 * 0.1).collect();
        rms_norm(&mut x, 8, &w, 1e-6);
        for (r, row) in orig.chunks(8).enumerate() {
            let ms: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 8.0;
            for j in 0..8 {
                let want = row[j] as f64 / (ms + 1e-6).sqrt() * w[j] as f64;
                assert!(
                    (x[r * 8 + j] as f64 - want).abs() < 1e-5,
                    "{} vs {want}",
                    x[r * 8 + j]
                );
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_handles_masked() {
        let mut x = vec![1.0, 2.0, 3.0, f32::NEG_INFINITY];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        assert!((x[2] / x[1] - 1f32.exp()).abs() < 1e-5);
        let mut big = vec![1000.0, 1000.0];
        softmax_inplace(&mut big);
        assert_eq!(big, vec![0.5, 0.5]);
        let mut all_masked = vec![f32::NEG_INFINITY; 3];
        softmax_inplace(&mut all_masked);
        assert_eq!(all_masked, vec![0.0; 3]);
    }

    #[test]
    fn silu_mul_values() {
        let mut g = vec![0.0, 1.0, -2.0];
        silu_mul(&mut g, &[3.0, 2.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
        assert!((g[2] - (-2.0 / (1.0 + 2f32.exp()))).abs() < 1e-6);
    }

    #[test]
    fn axpy_rows_is_successive_axpys_bit_for_bit() {
        for d in [1usize, 7, 8, 16, 24, 40, 128, 131] {
            let (stride, off, n) = (d + 5, 3, 9);
            let x: Vec<f32> = (0..off + n * stride)
                .map(|i| (i as f32 * 0.731).sin())
                .collect();
            let a_all: Vec<Vec<f32>> = (0..4)
                .map(|b| {
                    (0..n)
                        .map(|j| ((b * 13 + j * 7) as f32 * 0.29).cos())
                        .collect()
                })
                .collect();
            for lens in [vec![n], vec![3, 4, 5, 6], vec![0, 9, 2], vec![]] {
                let a: Vec<&[f32]> = lens.iter().zip(&a_all).map(|(&l, r)| &r[..l]).collect();
                let mut got = vec![f32::NAN; a.len() * d];
                axpy_rows(&mut got, d, &a, &x, off, stride);
                for (b, ab) in a.iter().enumerate() {
                    let mut want = vec![0f32; d];
                    for (j, &w) in ab.iter().enumerate() {
                        axpy(&mut want, w, &x[off + j * stride..][..d]);
                    }
                    assert_eq!(
                        &got[b * d..(b + 1) * d],
                        &want[..],
                        "d {d} lens {lens:?} row {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn dot_and_axpy_all_lengths() {
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot_f32(&a, &b) as f64 - want).abs() < 1e-5, "n = {n}");
            let mut y = b.clone();
            axpy(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }
}
