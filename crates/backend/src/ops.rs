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
