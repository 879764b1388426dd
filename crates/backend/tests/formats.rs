//! The backend's block decoding against the gguf crate's (itself bit-exact against gguf-py),
//! and matmul on weights made by ggml's reference quantizers.

mod common;

use common::{random_matrix, Rng, TYPES};
use mlaserve_backend::{dequantize_row_bytes, matmul, GgmlType, QMatrix};

#[test]
fn dequantize_is_bit_exact_against_gguf_quants() {
    let mut rng = Rng::new(11);
    for &ty in TYPES {
        let cols = 4 * ty.block_size().max(8);
        let w = random_matrix(ty, 6, cols, &mut rng);
        for r in 0..w.rows {
            let mut ours = vec![0f32; cols];
            let mut theirs = vec![0f32; cols];
            dequantize_row_bytes(ty, w.row(r), &mut ours).unwrap();
            mlaserve_gguf::quants::dequantize(ty, w.row(r), &mut theirs).unwrap();
            for c in 0..cols {
                assert_eq!(
                    ours[c].to_bits(),
                    theirs[c].to_bits(),
                    "{ty} row {r} col {c}: {} vs {}",
                    ours[c],
                    theirs[c]
                );
            }
        }
    }
}

#[test]
fn dequantize_row_bytes_rejects_bad_lengths() {
    let mut out = vec![0f32; 32];
    assert!(dequantize_row_bytes(GgmlType::Q8_0, &[0; 33], &mut out).is_err());
    let mut out = vec![0f32; 31];
    assert!(dequantize_row_bytes(GgmlType::Q8_0, &[0; 34], &mut out).is_err());
    assert!(dequantize_row_bytes(GgmlType::IQ2_XS, &[0; 74], &mut vec![0f32; 256]).is_err());
}

/// Quantized with ggml's reference quantizers, multiplied with smooth data: the result is
/// within the weight format's own error of the exact f32 product.
#[test]
fn quantized_weights_approximate_f32_product() {
    let mut rng = Rng::new(12);
    let (rows, cols, n_tokens) = (16, 512, 3);
    let wf = rng.vec(rows * cols, 1.0);
    let x = rng.vec(n_tokens * cols, 1.0);
    let exact: Vec<f64> = (0..n_tokens * rows)
        .map(|i| {
            let (t, r) = (i / rows, i % rows);
            (0..cols)
                .map(|c| wf[r * cols + c] as f64 * x[t * cols + c] as f64)
                .sum()
        })
        .collect();
    // RMS of a dot of two uniform[-1,1] vectors is sqrt(cols)/3 ≈ 7.5; the bound below is
    // the typical relative error of each format (ggml test-quantize-fns style), generous 2x.
    for (ty, rel) in [
        (GgmlType::F32, 1e-6),
        (GgmlType::F16, 2e-3),
        (GgmlType::BF16, 1e-2),
        (GgmlType::Q8_0, 1e-2),
        (GgmlType::Q6_K, 2e-2),
        (GgmlType::Q5_K, 4e-2),
        (GgmlType::Q5_0, 5e-2),
        (GgmlType::Q5_1, 5e-2),
        (GgmlType::Q4_K, 8e-2),
        (GgmlType::Q4_0, 1e-1),
        (GgmlType::Q4_1, 1e-1),
        (GgmlType::IQ4_NL, 1e-1),
        (GgmlType::IQ4_XS, 1e-1),
        (GgmlType::Q3_K, 2e-1),
        (GgmlType::Q2_K, 4e-1),
        (GgmlType::MXFP4, 2e-1),
        (GgmlType::Q8_K, 1e-2),
    ] {
        let w = QMatrix::quantize_from_f32(ty, rows, cols, &wf).unwrap();
        let mut out = vec![0f32; n_tokens * rows];
        matmul(&x, n_tokens, &w, &mut out);
        let num: f64 = out
            .iter()
            .zip(&exact)
            .map(|(o, e)| (*o as f64 - e).powi(2))
            .sum();
        let den: f64 = exact.iter().map(|e| e * e).sum();
        let nrmse = (num / den).sqrt();
        assert!(nrmse < rel, "{ty}: normalized RMS error {nrmse} >= {rel}");
    }
}
