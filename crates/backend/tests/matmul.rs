//! matmul against independent f64 references, for every weight type, every ISA level, odd
//! shapes and token counts.

mod common;

use common::{random_matrix, Rng, TYPES};
use mlaserve_backend::{
    dequantize_act_row, matmul, matmul_batch_with, matmul_with, quantize_act_row, ActType,
    GgmlType, Isa, MatmulJob, QMatrix,
};

/// Activation rows as the kernels see them: converted to `act`, then back to f32.
fn act_values(act: ActType, x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    let mut buf = vec![0u8; act.row_bytes(cols)];
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        quantize_act_row(act, xr, &mut buf);
        dequantize_act_row(act, &buf, or);
    }
    out
}

/// `(Σ w·a, Σ |w·a|)` in f64 for every (token, row).
fn reference(
    w: &[f32],
    a: &[f32],
    rows: usize,
    cols: usize,
    n_tokens: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut dot = vec![0f64; n_tokens * rows];
    let mut mag = vec![0f64; n_tokens * rows];
    for t in 0..n_tokens {
        for r in 0..rows {
            let (mut s, mut m) = (0f64, 0f64);
            for c in 0..cols {
                let p = w[r * cols + c] as f64 * a[t * cols + c] as f64;
                s += p;
                m += p.abs();
            }
            dot[t * rows + r] = s;
            mag[t * rows + r] = m;
        }
    }
    (dot, mag)
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let bs = ty.block_size();
    if bs == 1 {
        vec![(1, 1), (5, 13), (17, 37), (33, 256), (70, 1000)]
    } else {
        vec![
            (1, bs),
            (5, 2 * bs),
            (17, 3 * bs),
            (33, 8 * bs.max(64)),
            (70, 4096),
        ]
    }
}

#[test]
fn matches_dequantized_reference_tightly() {
    let mut rng = Rng::new(1);
    for &ty in TYPES {
        let act = ActType::for_weight(ty).unwrap();
        for (rows, cols) in shapes(ty) {
            let w = random_matrix(ty, rows, cols, &mut rng);
            let wf = w.to_f32();
            for n_tokens in [1usize, 3, 6, 17] {
                let x = rng.vec(n_tokens * cols, 2.0);
                let a = act_values(act, &x, cols);
                let (want, mag) = reference(&wf, &a, rows, cols, n_tokens);
                for isa in Isa::available() {
                    let mut out = vec![f32::NAN; n_tokens * rows];
                    matmul_with(isa, &x, n_tokens, &w, &mut out);
                    for i in 0..out.len() {
                        let err = (out[i] as f64 - want[i]).abs();
                        assert!(
                            err <= 1e-5 * mag[i] + 1e-30,
                            "{ty} {isa:?} [{rows}x{cols}] t={n_tokens} i={i}: got {} want {} (|w||a| {})",
                            out[i],
                            want[i],
                            mag[i]
                        );
                    }
                }
            }
        }
    }
}

/// Against plain f32 activations: the only error left is the activation rounding, bounded
/// element by element by half a quantization step times |w|.
#[test]
fn matches_f32_reference_within_activation_rounding() {
    let mut rng = Rng::new(2);
    for &ty in TYPES {
        let act = ActType::for_weight(ty).unwrap();
        let (rows, cols) = (9, 8 * ty.block_size().max(32));
        let w = random_matrix(ty, rows, cols, &mut rng);
        let wf = w.to_f32();
        let n_tokens = 5;
        let x = rng.vec(n_tokens * cols, 3.0);
        let a = act_values(act, &x, cols);
        let mut out = vec![0f32; n_tokens * rows];
        matmul(&x, n_tokens, &w, &mut out);
        let (want, mag) = reference(&wf, &x, rows, cols, n_tokens);
        for t in 0..n_tokens {
            for r in 0..rows {
                // Rounding bound: Σ |w_c|·|a_c − x_c| (measured per element, so it holds for
                // any quantizer), plus f32 summation slack.
                let bound: f64 = (0..cols)
                    .map(|c| {
                        (wf[r * cols + c] as f64).abs()
                            * (a[t * cols + c] as f64 - x[t * cols + c] as f64).abs()
                    })
                    .sum();
                let i = t * rows + r;
                let err = (out[i] as f64 - want[i]).abs();
                assert!(
                    err <= bound + 1e-5 * mag[i] + 1e-30,
                    "{ty} t={t} r={r}: err {err} > bound {bound}"
                );
                // And the bound itself is what the type promises: half a step of the format.
                let step = match act {
                    ActType::F32 => 0.0,
                    ActType::F16 => 2f64.powi(-11),
                    ActType::BF16 => 2f64.powi(-8),
                    _ => 0.5 / 127.0 * 1.01,
                };
                let amax_bound: f64 = (0..cols)
                    .map(|c| {
                        let blk = act.block_size().max(1);
                        let b0 = c / blk * blk;
                        let amax = x[t * cols + b0..t * cols + b0 + blk]
                            .iter()
                            .fold(0f64, |m, v| m.max(v.abs() as f64));
                        let scale = if act.block_size() == 1 {
                            (x[t * cols + c] as f64).abs()
                        } else {
                            amax
                        };
                        (wf[r * cols + c] as f64).abs() * scale * step
                    })
                    .sum();
                assert!(
                    bound <= amax_bound * 1.001 + 1e-12,
                    "{ty}: rounding {bound} above the format's {amax_bound}"
                );
            }
        }
    }
}

#[test]
fn f32_activations_multiply_the_dequantized_values() {
    // Every type, token counts on both tile widths, several chunks of columns, every level:
    // the f32 activations against the exact dequantized weights, as the f32 matrix of
    // to_f32() computes them (up to the order of f32 additions).
    let mut rng = Rng::new(12);
    for &ty in TYPES {
        let (rows, cols) = (21, 12 * ty.block_size().max(256));
        let w = random_matrix(ty, rows, cols, &mut rng);
        let wf = QMatrix::from_f32(rows, cols, w.to_f32());
        let exact = w.clone().with_f32_activations();
        assert!(exact.rows_slice(3, 5).has_f32_activations());
        for n_tokens in [1, 3, 70] {
            let x = rng.vec(n_tokens * cols, 2.0);
            let (want, mag) = reference(&wf.to_f32(), &x, rows, cols, n_tokens);
            for isa in Isa::available() {
                let mut got = vec![0f32; n_tokens * rows];
                let mut f32_out = vec![0f32; n_tokens * rows];
                matmul_with(isa, &x, n_tokens, &exact, &mut got);
                matmul_with(isa, &x, n_tokens, &wf, &mut f32_out);
                for i in 0..got.len() {
                    let err = (got[i] as f64 - want[i]).abs();
                    assert!(
                        err <= 1e-6 * mag[i] + 1e-30,
                        "{ty} {isa:?}: {err} vs {}",
                        mag[i]
                    );
                    let diff = (got[i] - f32_out[i]).abs() as f64;
                    assert!(
                        diff <= 2e-6 * mag[i] + 1e-30,
                        "{ty} {isa:?}: f32 matrix {diff}"
                    );
                }
            }
        }
    }
}

#[test]
fn f32_activations_do_not_depend_on_the_batch() {
    // ≤ 4 tokens take the register-dequantizing kernels, more a dequantized tile and the f32
    // kernel: a token's outputs must be the same bits either way.
    let mut rng = Rng::new(13);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        let (rows, cols) = (19, 2304);
        let w = random_matrix(ty, rows, cols, &mut rng).with_f32_activations();
        let x = rng.vec(70 * cols, 1.5);
        for isa in Isa::available() {
            let mut alone = vec![0f32; 70 * rows];
            for t in 0..70 {
                let o = &mut alone[t * rows..(t + 1) * rows];
                matmul_with(isa, &x[t * cols..(t + 1) * cols], 1, &w, o);
            }
            for n in [3, 5, 9, 70] {
                let mut got = vec![0f32; n * rows];
                matmul_with(isa, &x[..n * cols], n, &w, &mut got);
                assert_eq!(got, alone[..n * rows], "{ty} {isa:?} batch of {n}");
            }
        }
    }
}

#[test]
fn simd_equals_scalar() {
    let levels = Isa::available();
    if levels.len() < 2 {
        eprintln!("only the scalar level on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng::new(3);
    for &ty in TYPES {
        let cols = 16 * ty.block_size().max(32);
        let w = random_matrix(ty, 40, cols, &mut rng);
        for n_tokens in [1usize, 2, 3, 4, 5, 7, 9] {
            let x = rng.vec(n_tokens * cols, 1.0);
            let mut base = vec![0f32; n_tokens * w.rows];
            matmul_with(Isa::Scalar, &x, n_tokens, &w, &mut base);
            let act = act_values(ActType::for_weight(ty).unwrap(), &x, cols);
            let (_, mag) = reference(&w.to_f32(), &act, w.rows, cols, n_tokens);
            for &isa in &levels[1..] {
                let mut out = vec![0f32; n_tokens * w.rows];
                matmul_with(isa, &x, n_tokens, &w, &mut out);
                for i in 0..out.len() {
                    assert!(
                        ((out[i] - base[i]) as f64).abs() <= 2e-6 * mag[i] + 1e-30,
                        "{ty} {isa:?} t={n_tokens} i={i}: {} vs scalar {}",
                        out[i],
                        base[i]
                    );
                }
            }
        }
    }
}

/// The AVX-512 Q4_K/Q5_K/Q8_0/Q5_0 kernels take rows eight at a time but keep each row the
/// scalar vec_dot's arithmetic: equal bits whatever the row count, token count or threading.
#[test]
fn avx512_eight_row_kernels_are_scalar_bit_for_bit() {
    if !Isa::Avx512.is_available() {
        eprintln!("no AVX-512 on this CPU: nothing to compare");
        return;
    }
    let mut rng = Rng::new(11);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
    ] {
        for (rows, cols) in [(8, 256), (21, 768), (203, 5120)] {
            let w = random_matrix(ty, rows, cols, &mut rng);
            for n_tokens in [1usize, 2, 3, 4, 5, 9, 70] {
                let x = rng.vec(n_tokens * cols, 1.0);
                let mut want = vec![0f32; n_tokens * rows];
                let mut got = vec![0f32; n_tokens * rows];
                matmul_with(Isa::Scalar, &x, n_tokens, &w, &mut want);
                matmul_with(Isa::Avx512, &x, n_tokens, &w, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} [{rows}x{cols}] t={n_tokens}");
            }
        }
    }
}

#[test]
fn large_parallel_shapes_match_serial_rows() {
    // Big enough to take the threaded path and several token blocks.
    let mut rng = Rng::new(4);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::BF16,
        GgmlType::Q6_K,
    ] {
        let (rows, cols, n_tokens) = (203, 5120, 150);
        let w = random_matrix(ty, rows, cols, &mut rng);
        let x = rng.vec(n_tokens * cols, 1.0);
        let mut out = vec![0f32; n_tokens * rows];
        matmul(&x, n_tokens, &w, &mut out);
        // Each output row recomputed alone (1 token, no tiling) must agree exactly: the
        // per-(row, token) arithmetic does not depend on tiling.
        for t in [0usize, 1, 63, 64, 149] {
            let mut one = vec![0f32; rows];
            matmul(&x[t * cols..(t + 1) * cols], 1, &w, &mut one);
            assert_eq!(&out[t * rows..(t + 1) * rows], &one[..], "{ty} token {t}");
        }
    }
}

#[test]
fn products_inside_a_team_are_the_same_bits() {
    // Inside team::run the tiles go to spinning helpers instead of a rayon fork-join; which
    // thread runs a tile must not matter. A 3-thread pool so a helper exists even on 1 core.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let mut rng = Rng::new(21);
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::BF16] {
        let w = random_matrix(ty, 203, 2048, &mut rng);
        for n_tokens in [1usize, 3, 70] {
            let x = rng.vec(n_tokens * 2048, 1.0);
            let mut want = vec![0f32; n_tokens * 203];
            let mut got = vec![0f32; n_tokens * 203];
            pool.install(|| {
                matmul(&x, n_tokens, &w, &mut want);
                mlaserve_backend::team::run(|| {
                    for _ in 0..3 {
                        matmul(&x, n_tokens, &w, &mut got);
                    }
                });
            });
            assert_eq!(got, want, "{ty} t={n_tokens}");
        }
    }
}

#[test]
fn batch_is_each_job_alone_bit_for_bit() {
    // Jobs of mixed types, shapes and token counts (0, 1, 3, 5, 70: every tile width), some
    // sharing one x (one conversion), at every level, small and threaded.
    let mut rng = Rng::new(9);
    let cols = 1024;
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::F32,
        GgmlType::Q6_K,
        GgmlType::BF16,
        GgmlType::Q4_K,
    ];
    let rows = [33, 16, 128, 7, 300, 64, 1];
    let mut ws: Vec<QMatrix> = types
        .iter()
        .zip(rows)
        .map(|(&ty, r)| random_matrix(ty, r, cols, &mut rng))
        .collect();
    // Job 2 against f32 activations, sharing x with job 0 in the first case (no conversion
    // of its own).
    ws[2] = ws[2].clone().with_f32_activations();
    for n_tok in [[1usize; 7], [3, 3, 5, 0, 70, 3, 1]] {
        let xs: Vec<Vec<f32>> = n_tok.iter().map(|&n| rng.vec(n * cols, 1.0)).collect();
        // Jobs 0, 1 and 5 share x[0] where their token counts agree.
        let x_of = |i: usize| {
            if n_tok[i] == n_tok[0] && [1, 5].contains(&i) {
                0
            } else {
                i
            }
        };
        for isa in Isa::available() {
            let mut outs: Vec<Vec<f32>> =
                (0..7).map(|i| vec![f32::NAN; n_tok[i] * rows[i]]).collect();
            let mut jobs: Vec<MatmulJob> = outs
                .iter_mut()
                .enumerate()
                .map(|(i, out)| MatmulJob {
                    x: &xs[x_of(i)],
                    n_tokens: n_tok[i],
                    w: &ws[i],
                    out,
                })
                .collect();
            matmul_batch_with(isa, &mut jobs);
            for i in 0..7 {
                let mut want = vec![0f32; n_tok[i] * rows[i]];
                matmul_with(isa, &xs[x_of(i)], n_tok[i], &ws[i], &mut want);
                assert_eq!(
                    outs[i], want,
                    "{isa:?} job {i} ({}, {} tokens)",
                    types[i], n_tok[i]
                );
            }
        }
    }
}

#[test]
fn rows_slice_is_the_same_rows() {
    let mut rng = Rng::new(5);
    for &ty in TYPES {
        let cols = 2 * ty.block_size().max(16);
        let w = random_matrix(ty, 24, cols, &mut rng);
        let s = w.rows_slice(7, 10);
        assert_eq!((s.rows, s.cols, s.ty), (10, cols, ty));
        let full = w.to_f32();
        assert_eq!(s.to_f32(), full[7 * cols..17 * cols].to_vec(), "{ty}");
        let x = rng.vec(3 * cols, 1.0);
        let mut out_full = vec![0f32; 3 * 24];
        let mut out_s = vec![0f32; 3 * 10];
        matmul(&x, 3, &w, &mut out_full);
        matmul(&x, 3, &s, &mut out_s);
        for t in 0..3 {
            assert_eq!(
                &out_s[t * 10..t * 10 + 10],
                &out_full[t * 24 + 7..t * 24 + 17],
                "{ty}"
            );
        }
        let empty = w.rows_slice(24, 0);
        assert_eq!(empty.rows, 0);
    }
}

#[test]
fn from_f32_and_degenerate_shapes() {
    let w = QMatrix::from_f32(2, 3, vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
    let mut out = vec![0f32; 4];
    matmul(&[1.0, 1.0, 1.0, 2.0, 0.0, -1.0], 2, &w, &mut out);
    assert_eq!(out, vec![6.0, -0.5, -1.0, -2.0]);
    let mut none: Vec<f32> = vec![];
    matmul(&[], 0, &w, &mut none);
    let z = QMatrix::from_f32(3, 0, vec![]);
    let mut o = vec![7f32; 2 * 3];
    matmul(&[], 2, &z, &mut o);
    assert_eq!(o, vec![0.0; 6]);
}

#[test]
#[should_panic(expected = "matmul: x has")]
fn wrong_activation_length_panics_with_message() {
    let w = QMatrix::from_f32(2, 3, vec![0.0; 6]);
    let mut out = vec![0f32; 2];
    matmul(&[0.0; 4], 1, &w, &mut out);
}
