//! GGUF weights on the GPU: x quantization, the int8 GEMVs and GEMMs, the tensor-core and
//! dequantize paths, the fused quantized down.

use super::*;

/// x quantized per 32 values by the GPU's rule (`q8_block`; ggml's quantize_row_q8_0): int8
/// values q = round(x / d) and scales d = amax / 127 per block.
fn q8_host(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; x.len() / 32];
    for (b, blk) in x.chunks(32).enumerate() {
        let db = blk.iter().fold(0f32, |a, &v| a.max(v.abs())) / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        for (j, &v) in blk.iter().enumerate() {
            q[b * 32 + j] = (v * id).round() as i8;
        }
        d[b] = db;
    }
    (q, d)
}

/// x [m, k] as [`Gpu::quantize_mmq_x`] lays it out for `ty`, from the host rules: xq
/// [k / 256][mp][256] and the float pairs of xds [k / 256][8][mp] as bits (Q8_0: (d,
/// d * sum(q)); Q4_K: (u, the int16 pair (u bsum) of sub-blocks s, s + 1) for even s, (u, D)
/// for odd s), rows m .. mp zero (Q4_K: u = 1).
fn mmq_x_host(x: &[f32], m: usize, mp: usize, k: usize, q4k: bool) -> (Vec<i8>, Vec<u32>) {
    use mlaserve_cuda::qmmq::q8u_host;
    let chunks = k / 256;
    let (mut xq, mut xds) = (
        vec![0i8; chunks * mp * 256],
        vec![0u32; chunks * 8 * mp * 2],
    );
    for t in 0..mp {
        for c in 0..chunks {
            for s in 0..8 {
                let slot = ((c * 8 + s) * mp + t) * 2;
                xds[slot] = if q4k { 1 } else { 0 };
            }
        }
    }
    for t in 0..m {
        let row = &x[t * k..(t + 1) * k];
        // (q, the slots of sub-block b = c * 8 + s as bits)
        let (q, slots): (Vec<i8>, Vec<(u32, u32)>) = if q4k {
            let (q, u, d) = q8u_host(row);
            let bsum = |b: usize| -> i32 {
                u[b] * q[b * 32..b * 32 + 32]
                    .iter()
                    .map(|&v| v as i32)
                    .sum::<i32>()
            };
            let slots = (0..k / 32)
                .map(|b| {
                    let y = if b % 2 == 1 {
                        d[b / 8].to_bits()
                    } else {
                        (bsum(b) as u32 & 0xffff) | ((bsum(b + 1) as u32) << 16)
                    };
                    (u[b] as u32, y)
                })
                .collect();
            (q, slots)
        } else {
            let (q, d) = q8_host(row);
            let slots = (0..k / 32)
                .map(|b| {
                    let sum: i32 = q[b * 32..b * 32 + 32].iter().map(|&v| v as i32).sum();
                    (d[b].to_bits(), (d[b] * sum as f32).to_bits())
                })
                .collect();
            (q, slots)
        };
        for c in 0..chunks {
            let dst = (c * mp + t) * 256;
            xq[dst..dst + 256].copy_from_slice(&q[c * 256..c * 256 + 256]);
            for s in 0..8 {
                let slot = ((c * 8 + s) * mp + t) * 2;
                (xds[slot], xds[slot + 1]) = slots[c * 8 + s];
            }
        }
    }
    (xq, xds)
}

/// Quantized weights kept compressed (`mlaserve_cuda::qgemv`), random weights quantized on the
/// host with the crate's own quantizers:
/// - x quantized to int8 per 32 values: exactly the host's rule (d = amax / 127,
///   q = round(x / d)), bit for bit;
/// - the int8 GEMV at M = 1 .. 8 (every kernel variant, persistent grids capped to 1 and 7
///   CTAs, accumulate) against the CPU dequantization times the quantized x in f64 (bound 1e-4:
///   only f32 summation order differs), and against the unquantized x (bound 2e-2: what
///   quantizing x costs);
/// - the expert GEMV over pairs (a missing expert pointer, an expert not held);
/// - x quantized for the int8 tensor-core kernel (Q8_0 per 32 values; Q4_K a scale a chunk and
///   an integer factor a sub-block, `qmmq::x_q8u`) bit for bit against the host rules;
/// - M = 1 .. 64 on that kernel (k % 256 == 0; accumulate, splits along K) against the stored
///   weights times x so quantized in f64 (bound 1e-4), dense and grouped;
/// - M = 5 .. 64 on the tensor-core kernel (dense mode, accumulate) and M = 80 through
///   dequantize + cuBLAS, against the bf16-rounded dequantized weights in f64; the
///   dequantize kernel bit-exact against the CPU dequantizer rounded to bf16;
/// - the grouped expert GEMM dequantizing tiles in shared memory: bit-identical to the bf16
///   grouped GEMM over the dequantized weights.
///
/// Q8_0 widths 2080 and 1408 leave partial warp steps; Q4_K 1280 a partial super-block step.
pub(super) fn quantized(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_backend::QMatrix;
    use mlaserve_cuda::qgemv::{PairCombine, QPath, QType, QmvAlso, QmvNorm, QmvVariant};
    use mlaserve_cuda::qmmq::{q8u_host, x_q8u};
    use rayon::prelude::*;
    // (type, rows, k, sweep every variant)
    let cases = [
        (QType::Q8_0, 576usize, 2048usize, true),
        (QType::Q8_0, 130, 2080, true),
        (QType::Q8_0, 300, 1408, false),
        (QType::Q8_0, 1024, 7168, false),
        (QType::Q8_0, 2048, 10944, false),
        (QType::Q4K, 576, 2048, true),
        (QType::Q4K, 200, 1280, true),
        (QType::Q4K, 1024, 7168, false),
        (QType::Q8_0, 301, 1024, false), // odd rows: a last row group of one
        (QType::Q4K, 257, 1024, false),
        // one chunk of 256: the int8 tensor-core kernel without a split along K
        (QType::Q4K, 520, 256, false),
        (QType::Q8_0, 72, 256, false),
        // 266 row blocks of 64: no split on 132 SMs, 8 chunks a block through the x ring
        (QType::Q4K, 17000, 2048, false),
        // 66 row blocks, 16 chunks: the int8 kernel's split by the busiest-SM model (2 splits)
        (QType::Q4K, 4224, 4096, false),
    ];
    for &(ty, rows, k, sweep) in &cases {
        let ggml = ty.ggml();
        let qm = QMatrix::quantize_from_f32(ggml, rows, k, &rng.vec(rows * k, 0.05)).unwrap();
        let wf = qm.to_f32();
        let wd = gpu.upload_qmat(ty, rows, k, qm.data()).unwrap();
        let mmax = 80usize;
        let x = round_bf(&rng.vec(mmax * k, 1.0));
        let xb = gpu
            .upload(&x.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        // x quantized on the host by the kernel's rule.
        let (xq, xdq) = q8_host(&x);
        let qx = gpu.quantize_x(xb.ptr(), mmax, k).unwrap();
        let gq = gpu.to_host(&qx.q).unwrap();
        let gd = gpu.to_host(&qx.d).unwrap();
        let mism = gq.iter().zip(&xq).filter(|(a, b)| a != b).count()
            + gd.iter()
                .zip(&xdq)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
        rep.check(
            "quantize_x",
            format!("[{mmax} x {k}]"),
            "bf16>i8",
            mism as f64,
            0.0,
        );
        // x as the int8 tensor-core kernels take it (Q4_K: q8u, Q8_0: per 32), bit for bit
        // against the host rules, at one and at eight tiles (rows past m zero).
        if k % 256 == 0 && gpu.has_flash_attn() {
            for m in [5usize, 64] {
                let mp = if m <= 8 { 8 } else { 64 };
                let (gq, gd) = gpu.quantize_mmq_x(xb.ptr(), m, k, ty).unwrap();
                let (hq, hd) = mmq_x_host(&x, m, mp, k, x_q8u(ty) == 1);
                let gd = gpu.to_host(&gd).unwrap();
                let mism = (gpu.to_host(&gq).unwrap().iter().zip(&hq))
                    .filter(|(a, b)| a != b)
                    .count()
                    + gd.iter()
                        .zip(&hd)
                        .filter(|(a, b)| a.to_bits() != **b)
                        .count();
                let name = format!("{ty:?} [{m} x {k}]");
                rep.check("quantize_mmq_x", name, "bf16>i8", mism as f64, 0.0);
            }
        }
        // In f64: `want` over the quantized x (first 8 vectors), `want_x` over x itself, and
        // `want_bf` over the weights rounded to bf16 (what the tensor-core path multiplies).
        let wr = round_bf(&wf);
        let dot = |mm: usize, w: &[f32], xv: &(dyn Fn(usize) -> f64 + Sync)| -> Vec<f32> {
            (0..mm * rows)
                .into_par_iter()
                .map(|i| {
                    let (m, r) = (i / rows, i % rows);
                    (0..k)
                        .map(|c| w[r * k + c] as f64 * xv(m * k + c))
                        .sum::<f64>() as f32
                })
                .collect()
        };
        // (64 vectors where the int8 tensor-core kernel takes the matrix: k % 256 == 0)
        let nq = if k % 256 == 0 { 64 } else { 8 };
        let want = dot(nq, &wf, &|i| xq[i] as f64 * xdq[i / 32] as f64);
        // The int8 tensor-core kernel's reference: Q4_K takes x by the q8u rule there.
        let want_k;
        let want_mmq: &[f32] = if k % 256 == 0 && x_q8u(ty) == 1 {
            let (xk, u, d) = q8u_host(&x[..nq * k]);
            let v = |i: usize| xk[i] as f64 * u[i / 32] as f64 * d[i / 256] as f64;
            want_k = dot(nq, &wf, &v);
            &want_k
        } else {
            &want
        };
        // The reference of the path `qgemm` takes for m rows.
        let want_of = |m: usize| match gpu.qgemm_path(&wd, m) {
            QPath::Mmq => want_mmq,
            _ => &want[..],
        };
        let want_x = dot(8, &wf, &|i| x[i] as f64);
        let want_bf = dot(mmax, &wr, &|i| x[i] as f64);
        let shape = |m: usize| format!("{ty:?} [{rows} x {k}] M{m}");
        // The routed experts' combine in the epilogue of one token's product: bit for bit
        // moe_combine_pairs into out, then the GEMV accumulating (k slots, weights and rows
        // random); past 32 slots refused.
        for kk in [6usize, 1, 8, 32] {
            let y = gpu.upload(&rng.vec(kk * rows, 1.0)).unwrap();
            let cw = gpu.upload(&rng.vec(kk, 1.0)).unwrap();
            let base = rng.vec(rows, 1.0);
            let (want, got) = (poisoned::<f32>(gpu, rows), poisoned::<f32>(gpu, rows));
            gpu.write(&want, 0, &base).unwrap();
            gpu.write(&got, 0, &base).unwrap();
            gpu.moe_combine_pairs(1, want.ptr(), y.ptr(), cw.ptr(), kk, rows)
                .unwrap();
            gpu.qmv(&wd, xb.ptr(), 0, 1, want.ptr(), true).unwrap();
            let c = PairCombine {
                y: y.ptr(),
                w: cw.ptr(),
                k: kk,
            };
            if !gpu.combine_fits(&wd, 1, kk) {
                continue; // MLASERVE_QMV_COMBINE=0 or _WIDE=0
            }
            gpu.qmv_combine(&wd, xb.ptr(), got.ptr(), c).unwrap();
            let b = gpu.to_host(&want).unwrap();
            let bits = |a: &[f32]| {
                let diff = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits());
                diff.count()
            };
            let mism = bits(&gpu.to_host(&got).unwrap());
            let name = format!("{} k{kk} vs moe_combine_pairs+qmv", shape(1));
            rep.check("qmv_combine", name, "q*i8>f32", mism as f64, 0.0);
            // both kernels with a twin, on full and capped grids (a warp walks many groups)
            for v in QmvVariant::one_vector(ty) {
                if !gpu.one_vector_runs(ty, v) {
                    continue; // a bulk kernel before sm_90
                }
                for cap in [None, Some(1), Some(3)] {
                    gpu.write(&got, 0, &base).unwrap();
                    gpu.qmv_combine_variant(&wd, xb.ptr(), got.ptr(), c, v, cap)
                        .unwrap();
                    let mism = bits(&gpu.to_host(&got).unwrap());
                    let name = format!("{} k{kk} {} grid {cap:?}", shape(1), v.kernel(ty));
                    rep.check("qmv_combine", name, "q*i8>f32", mism as f64, 0.0);
                }
            }
            let c33 = PairCombine { k: 33, ..c };
            assert!(gpu.qmv_combine(&wd, xb.ptr(), got.ptr(), c33).is_err());
        }
        // The attention norm in a one-vector product's prologue (qmv_norm): its output and the
        // hnb row it leaves bit for bit rms_norm into hnb then the plain kernel of that row, on
        // every twin; then as the executor calls it (the kernel qgemm takes), where it runs.
        let xf = gpu.upload(&rng.vec(k, 2.0)).unwrap();
        let gamma = gpu.upload(&rng.vec(k, 1.0)).unwrap();
        let hnb_ref = poisoned::<u16>(gpu, k);
        gpu.rms_norm(
            1,
            xf.ptr(),
            k,
            0,
            gamma.ptr(),
            0,
            0,
            hnb_ref.ptr(),
            k,
            k,
            1e-6,
        )
        .unwrap();
        let hb_want = gpu.to_host(&hnb_ref).unwrap();
        let norm_vs = |want: &DBuf<f32>, run: &dyn Fn(QmvNorm, u64)| -> f64 {
            let (got, hb) = (poisoned::<f32>(gpu, rows), poisoned::<u16>(gpu, k));
            let n = QmvNorm {
                x: xf.ptr(),
                gamma: gamma.ptr(),
                eps: 1e-6,
                hnb: hb.ptr(),
            };
            run(n, got.ptr());
            let w = gpu.to_host(want).unwrap();
            let out = gpu.to_host(&got).unwrap();
            let hb = gpu.to_host(&hb).unwrap();
            (out.iter()
                .zip(&w)
                .filter(|(a, b)| a.to_bits() != b.to_bits()))
            .count()
            .max(hb.iter().zip(&hb_want).filter(|(a, b)| a != b).count()) as f64
        };
        for v in QmvVariant::one_vector(ty) {
            if !gpu.one_vector_runs(ty, v) {
                continue; // a bulk kernel before sm_90
            }
            let want = poisoned::<f32>(gpu, rows);
            gpu.qmv_variant(&wd, hnb_ref.ptr(), 0, 1, want.ptr(), false, v, None)
                .unwrap();
            let mism = norm_vs(&want, &|n, out| {
                gpu.qmv_norm_variant(&wd, n, out, None, v).unwrap();
            });
            let name = format!("{} {}_norm vs rms_norm+qmv", shape(1), v.kernel(ty));
            rep.check("qmv_norm", name, "q*i8>f32", mism, 0.0);
        }
        // ... with a second matrix of 37 rows (kv_a's place: odd, so its last group is one
        // row) in the same launch: both outputs bit for bit the plain kernel of hnb.
        let r2 = 37;
        let q2 = QMatrix::quantize_from_f32(ggml, r2, k, &rng.vec(r2 * k, 0.05)).unwrap();
        let w2b = gpu.upload_qmat(ty, r2, k, q2.data()).unwrap();
        let want2 = poisoned::<f32>(gpu, r2);
        gpu.qgemm(&w2b, 1, hnb_ref.ptr(), want2.ptr(), false)
            .unwrap();
        let want2 = gpu.to_host(&want2).unwrap();
        let second = |run: &dyn Fn(QmvNorm, u64, QmvAlso)| -> (f64, f64) {
            let got2 = poisoned::<f32>(gpu, r2);
            let also = QmvAlso {
                w: &w2b,
                out: got2.ptr(),
            };
            let want = poisoned::<f32>(gpu, rows);
            gpu.qgemm(&wd, 1, hnb_ref.ptr(), want.ptr(), false).unwrap();
            let first = norm_vs(&want, &|n, out| run(n, out, also));
            let got2 = gpu.to_host(&got2).unwrap();
            let m2 = got2
                .iter()
                .zip(&want2)
                .filter(|(a, b)| a.to_bits() != b.to_bits());
            (first, m2.count() as f64)
        };
        // (every one-vector kernel walks a row's K in the same lanes and order: the same sums)
        for v in QmvVariant::one_vector(ty) {
            if !gpu.one_vector_runs(ty, v) {
                continue;
            }
            let (m1, m2) = second(&|n, out, also| {
                gpu.qmv_norm_variant(&wd, n, out, Some(also), v).unwrap();
            });
            let name = format!(
                "{} + [{r2} x {k}] {}_norm vs rms_norm+qmv",
                shape(1),
                v.kernel(ty)
            );
            rep.check("qmv_norm", name, "q*i8>f32", m1.max(m2), 0.0);
        }
        if gpu.qmv_norm_fits(&wd, None).unwrap() {
            let want = poisoned::<f32>(gpu, rows);
            gpu.qgemm(&wd, 1, hnb_ref.ptr(), want.ptr(), false).unwrap();
            let mism = norm_vs(&want, &|n, out| gpu.qmv_norm(&wd, n, out, None).unwrap());
            let name = format!("{} vs rms_norm+qgemm", shape(1));
            rep.check("qmv_norm", name, "q*i8>f32", mism, 0.0);
        }
        if gpu.qmv_norm_fits(&wd, Some(&w2b)).unwrap() {
            let (m1, m2) = second(&|n, out, also| gpu.qmv_norm(&wd, n, out, Some(also)).unwrap());
            let name = format!("{} + [{r2} x {k}] vs rms_norm+qgemm", shape(1));
            rep.check("qmv_norm", name, "q*i8>f32", m1.max(m2), 0.0);
        }
        // out (poisoned, or random when accumulating) after `f`, against `want` (+ base).
        let mut run = |m: usize, acc: bool, want: &[f32], f: &dyn Fn(u64)| -> f64 {
            let out = poisoned::<f32>(gpu, m * rows);
            let base = rng.vec(m * rows, 1.0);
            if acc {
                gpu.write(&out, 0, &base).unwrap();
            }
            f(out.ptr());
            let mut w = want[..m * rows].to_vec();
            if acc {
                w.iter_mut().zip(&base).for_each(|(a, b)| *a += b);
            }
            rel_err(&gpu.to_host(&out).unwrap(), &w)
        };
        // The GEMV: every variant with mt and mt - 1 vectors from vector 0, and one vector at
        // vector 5 with a capped persistent grid (each warp walks many row groups).
        // The bulk kernels (Q4_K, sm_90): the register walk's sums bit for bit, at vectors 0
        // and 5, on full and capped grids (a warp walks many row groups through its slots).
        for v in [QmvVariant::BULK, QmvVariant::BULK3] {
            if !gpu.one_vector_runs(ty, v) {
                continue;
            }
            for (row, cap) in [(0usize, None), (5, Some(1usize)), (5, Some(7))] {
                let (want, got) = (poisoned::<f32>(gpu, rows), poisoned::<f32>(gpu, rows));
                let reg = QmvVariant::for_m(ty, 1).unwrap();
                gpu.qmv_variant(&wd, xb.ptr(), row, 1, want.ptr(), false, reg, cap)
                    .unwrap();
                gpu.qmv_variant(&wd, xb.ptr(), row, 1, got.ptr(), false, v, cap)
                    .unwrap();
                let (a, b) = (gpu.to_host(&want).unwrap(), gpu.to_host(&got).unwrap());
                let mism = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits());
                let name = format!(
                    "{} x{row} cap{cap:?} {} vs {}",
                    shape(1),
                    v.kernel(ty),
                    reg.kernel(ty)
                );
                rep.check("qmv bulk", name, "q*i8>f32", mism.count() as f64, 0.0);
            }
        }
        if sweep {
            let bulk = [QmvVariant::BULK, QmvVariant::BULK3]
                .into_iter()
                .filter(|&v| gpu.one_vector_runs(ty, v));
            for v in QmvVariant::ALL.into_iter().chain(bulk) {
                let mut cases = vec![(0usize, v.mt, None), (5, 1, Some(1usize)), (5, 1, Some(7))];
                if v.mt > 1 {
                    cases.push((0, v.mt - 1, None));
                }
                for (row, m, cap) in cases {
                    let wv = &want[row * rows..(row + m) * rows];
                    let err = run(m, false, wv, &|o| {
                        gpu.qmv_variant(&wd, xb.ptr(), row, m, o, false, v, cap)
                            .unwrap()
                    });
                    let name = format!("{} {} x{row} cap{cap:?}", shape(m), v.kernel(ty));
                    rep.check("qmv", name, "q*i8>f32", err, 1e-4);
                }
            }
        }
        for m in [1usize, 2, 3, 4, 6, 8] {
            let err = run(m, false, want_of(m), &|o| {
                gpu.qgemm(&wd, m, xb.ptr(), o, false).unwrap()
            });
            rep.check("qgemm int8", shape(m), "q*i8>f32", err, 1e-4);
        }
        let err = run(1, false, &want_x, &|o| {
            gpu.qgemm(&wd, 1, xb.ptr(), o, false).unwrap()
        });
        rep.check("qgemm int8 vs x", shape(1), "q*bf16>f32", err, 2e-2);
        for m in [1usize, 3] {
            let err = run(m, true, want_of(m), &|o| {
                gpu.qgemm(&wd, m, xb.ptr(), o, true).unwrap()
            });
            rep.check("qgemm accumulate", shape(m), "q*i8>f32", err, 1e-4);
        }
        // The int8 tensor-core kernel (k % 256 == 0): 1 to 64 rows (every tile count, partial
        // tiles, accumulate), over the quantized x, and the split along K on and off
        // (`qmmq::mmq_splits` on an H200: the 4,224-row case 2 splits by the busiest-SM model;
        // the other cases but the 17,000-row one, which walks 8 chunks a block unsplit, and
        // those of one chunk split by the older rule, two blocks an SM).
        if gpu.has_flash_attn() && gpu.mmq_fits(&wd, 2) {
            for (m, acc) in [
                (2usize, false),
                (5, true),
                (8, false),
                (9, false),
                (16, true),
            ]
            .into_iter()
            .chain([(17, false), (31, true), (33, false), (64, true), (1, false)])
            {
                let err = run(m, acc, want_mmq, &|o| {
                    gpu.qgemm_mmq(&wd, m, xb.ptr(), o, acc).unwrap()
                });
                rep.check("qgemm_mmq", shape(m), "q*i8>f32", err, 1e-4);
            }
            assert!(gpu.qgemm_mmq(&wd, 65, xb.ptr(), 0, false).is_err());
        }
        // The tensor-core kernel (16- and 64-row tiles, partial ones): straight through
        // `qgemm_tc` from 5 rows, over the bf16-rounded weights; `qgemm` past the GEMV's 8
        // rows against the reference of the path it takes (the int8 kernel: the quantized x;
        // the bf16 one: the bf16-rounded weights); M = 80: dequantize + cuBLAS.
        if gpu.has_flash_attn() {
            for (m, acc) in [(5usize, false), (13, true), (16, false)] {
                let err = run(m, acc, &want_bf, &|o| {
                    gpu.qgemm_tc(&wd, m, xb.ptr(), o, acc).unwrap()
                });
                rep.check("qgemm_tc", shape(m), "q>bf16>f32", err, 1e-4);
            }
            for (m, acc) in [(12usize, true), (17, false), (40, false), (64, true)] {
                let path = gpu.qgemm_path(&wd, m);
                let (reference, ty_s) = match path {
                    QPath::Mmq => (want_mmq, "q*i8>f32"),
                    _ => (&want_bf[..], "q>bf16>f32"),
                };
                let err = run(m, acc, reference, &|o| {
                    gpu.qgemm(&wd, m, xb.ptr(), o, acc).unwrap()
                });
                rep.check(
                    "qgemm tensor core",
                    format!("{} {path:?}", shape(m)),
                    ty_s,
                    err,
                    1e-4,
                );
            }
        }
        let err = run(mmax, false, &want_bf, &|o| {
            gpu.qgemm(&wd, mmax, xb.ptr(), o, false).unwrap()
        });
        rep.check("qgemm dequant+gemm", shape(mmax), "q>bf16>f32", err, 1e-4);
        // Expert GEMV over pairs: three experts (the second without weights), pairs routed to
        // experts 0..4 with `first` = 1, so ids 0 and 4 are not held; x row = pair / 2.
        let w2 = gpu.upload_qmat(ty, rows, k, qm.data()).unwrap();
        let ptrs = gpu.upload(&[wd.w.ptr(), 0, w2.w.ptr()]).unwrap();
        let ids: Vec<i32> = (0..10).map(|p| p % 5).collect();
        let idd = gpu.upload(&ids).unwrap();
        let out = poisoned::<f32>(gpu, ids.len() * rows);
        gpu.qmv_pairs(
            ty,
            ids.len(),
            ptrs.ptr(),
            1,
            3,
            idd.ptr(),
            xb.ptr(),
            k,
            2,
            rows,
            out.ptr(),
        )
        .unwrap();
        let mut wp = vec![0f32; ids.len() * rows];
        for (p, &id) in ids.iter().enumerate() {
            if id == 1 || id == 3 {
                let src = p / 2;
                wp[p * rows..(p + 1) * rows].copy_from_slice(&want[src * rows..(src + 1) * rows]);
            }
        }
        let err = rel_err(&gpu.to_host(&out).unwrap(), &wp);
        rep.check("qmv_pairs", shape(1), "q*i8>f32", err, 1e-4);
        // ids final (uploaded before): the matrices looked up and their first steps requested
        // before the wait — bit for bit the waiting launch, over a table whose two held
        // matrices differ (so a matrix looked up wrongly shows)
        let qm3 = QMatrix::quantize_from_f32(ggml, rows, k, &rng.vec(rows * k, 0.05)).unwrap();
        let w3 = gpu.upload_qmat(ty, rows, k, qm3.data()).unwrap();
        let ptrs3 = gpu.upload(&[wd.w.ptr(), 0, w3.w.ptr()]).unwrap();
        let p = (ids.len(), ptrs3.ptr(), 1, 3, idd.ptr());
        let [plain, early] = [false, true].map(|ids_final| {
            let o = poisoned::<f32>(gpu, ids.len() * rows);
            gpu.qmv_pairs_after(ty, p, xb.ptr(), k, 2, rows, o.ptr(), ids_final)
                .unwrap();
            gpu.to_host(&o).unwrap()
        });
        let mism = early
            .iter()
            .zip(&plain)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let name = format!("{}, ids final vs qmv_pairs", shape(1));
        rep.check("qmv_pairs", name, "q*i8>f32", mism as f64, 0.0);
        // Each kernel the pairs can take (MLASERVE_QMV_PAIRS_W3): bit for bit qmv_pairs.
        let pairs_out = gpu.to_host(&out).unwrap();
        let p = (ids.len(), ptrs.ptr(), 1, 3, idd.ptr());
        for v in [QmvVariant::PAIRS, QmvVariant::WIDE3] {
            let o = poisoned::<f32>(gpu, ids.len() * rows);
            gpu.qmv_pairs_variant(ty, p, xb.ptr(), k, 2, rows, o.ptr(), None, v)
                .unwrap();
            let got = gpu.to_host(&o).unwrap();
            let mism = got
                .iter()
                .zip(&pairs_out)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let name = format!("{} {} vs qmv_pairs", shape(1), v.kernel(ty));
            rep.check("qmv_pairs", name, "q*i8>f32", mism as f64, 0.0);
        }
        // The SwiGLU epilogue (the matrix as a gate|up [2f, k]): bit for bit the GEMV into f32
        // then silu_mul, dense at vectors 0 and 5 (the default kernel, then both kernels with
        // a twin on full and capped grids, where a warp walks many row pairs) and over the
        // pairs above (zeros where not held).
        if rows % 2 == 0 && gpu.qmv_glu_on() {
            let f = rows / 2;
            let bits = |a: &[u16], b: &[u16]| a.iter().zip(b).filter(|(x, y)| x != y).count();
            for row in [0usize, 5] {
                let gu = poisoned::<f32>(gpu, rows);
                gpu.qmv(&wd, xb.ptr(), row, 1, gu.ptr(), false).unwrap();
                let (want, got) = (poisoned::<u16>(gpu, f), poisoned::<u16>(gpu, f));
                gpu.silu_mul(gu.ptr(), want.ptr(), f, 1).unwrap();
                let want = gpu.to_host(&want).unwrap();
                gpu.qmv_glu(&wd, xb.ptr(), row, got.ptr()).unwrap();
                let mism = bits(&gpu.to_host(&got).unwrap(), &want);
                let name = format!("{} x{row} vs qmv+silu_mul", shape(1));
                rep.check("qmv_glu", name, "q*i8>bf16", mism as f64, 0.0);
                for v in QmvVariant::one_vector(ty) {
                    if !gpu.one_vector_runs(ty, v) {
                        continue;
                    }
                    for cap in [None, Some(1), Some(3)] {
                        let got = poisoned::<u16>(gpu, f);
                        gpu.qmv_glu_variant(&wd, xb.ptr(), row, got.ptr(), v, cap)
                            .unwrap();
                        let mism = bits(&gpu.to_host(&got).unwrap(), &want);
                        let name = format!(
                            "{} x{row} {} grid {cap:?} vs qmv+silu_mul",
                            shape(1),
                            v.kernel(ty)
                        );
                        rep.check("qmv_glu", name, "q*i8>bf16", mism as f64, 0.0);
                    }
                }
            }
            let want = poisoned::<u16>(gpu, ids.len() * f);
            gpu.silu_mul(out.ptr(), want.ptr(), f, ids.len()).unwrap();
            let got = poisoned::<u16>(gpu, ids.len() * f);
            let none = SliceViews::NONE;
            gpu.qmv_pairs_glu(ty, p, xb.ptr(), k, 2, f, none, got.ptr())
                .unwrap();
            let mism = bits(&gpu.to_host(&got).unwrap(), &gpu.to_host(&want).unwrap());
            let name = format!("{} vs qmv_pairs+silu_mul", shape(1));
            rep.check("qmv_pairs_glu", name, "q*i8>bf16", mism as f64, 0.0);
            let want = gpu.to_host(&want).unwrap();
            for v in [QmvVariant::PAIRS, QmvVariant::WIDE3] {
                let got = poisoned::<u16>(gpu, ids.len() * f);
                let glu = Some((f, got.ptr()));
                gpu.qmv_pairs_variant(ty, p, xb.ptr(), k, 2, rows, 0, glu, v)
                    .unwrap();
                let mism = bits(&gpu.to_host(&got).unwrap(), &want);
                let name = format!("{} {} vs qmv_pairs+silu_mul", shape(1), v.kernel(ty));
                rep.check("qmv_pairs_glu", name, "q*i8>bf16", mism as f64, 0.0);
            }
            // Shared-expert slices (MLASERVE_QMV_SLICES): the matrix as a shared gate|up
            // [2fs, k] cut into s slices of width fs / s beside one routed expert (its first
            // 2 fs / s rows as a matrix of its own), two tokens (x rows 0 and 1) of 1 + s
            // slots: each token's slice rows are qmv_glu over the whole matrix, its routed row
            // qmv_glu over the expert's, bit for bit (Q8_0: the slices' scales found after the
            // shared matrix's rows).
            if let Some(ns) = [3usize, 2].into_iter().find(|n| f % n == 0) {
                let fe = f / ns;
                // (its up rows are the shared matrix's rows fe.., not slice 0's f..)
                let qe = QMatrix::quantize_from_f32(ggml, 2 * fe, k, &wf[..2 * fe * k]).unwrap();
                let ex = gpu.upload_qmat(ty, 2 * fe, k, qe.data()).unwrap();
                let mut tab = vec![ex.w.ptr()];
                tab.extend((0..ns).map(|j| wd.row_ptr(j * fe)));
                let tab = gpu.upload(&tab).unwrap();
                let slots = 1 + ns;
                let sids: Vec<i32> = (0..2 * slots as i32).map(|p| p % slots as i32).collect();
                let sidd = gpu.upload(&sids).unwrap();
                let views = SliceViews { e_routed: 1, fs: f };
                let got = poisoned::<u16>(gpu, 2 * slots * fe);
                let sp = (sids.len(), tab.ptr(), 0, slots, sidd.ptr());
                gpu.qmv_pairs_glu(ty, sp, xb.ptr(), k, slots, fe, views, got.ptr())
                    .unwrap();
                let got = gpu.to_host(&got).unwrap();
                let mut mism = 0;
                for v in 0..2 {
                    let (wr, ws) = (poisoned::<u16>(gpu, fe), poisoned::<u16>(gpu, f));
                    gpu.qmv_glu(&ex, xb.ptr(), v, wr.ptr()).unwrap();
                    gpu.qmv_glu(&wd, xb.ptr(), v, ws.ptr()).unwrap();
                    let tok = &got[v * slots * fe..(v + 1) * slots * fe];
                    mism += bits(&tok[..fe], &gpu.to_host(&wr).unwrap());
                    mism += bits(&tok[fe..], &gpu.to_host(&ws).unwrap());
                }
                let name = format!("{} 1+{ns} slots, {ns} slices vs qmv_glu", shape(1));
                rep.check("qmv_pairs_glu", name, "q*i8>bf16", mism as f64, 0.0);
            }
        }
        // The dequantize kernel, bit-exact against the CPU's values rounded to bf16.
        let deq = poisoned::<u16>(gpu, rows * k);
        gpu.dequant_bf16(&wd, deq.ptr()).unwrap();
        let got = gpu.to_host(&deq).unwrap();
        let wb: Vec<u16> = wf.iter().map(|&v| bf(v)).collect();
        let mism = got.iter().zip(&wb).filter(|(a, b)| a != b).count();
        rep.check(
            "dequant_bf16",
            format!("{ty:?} [{rows} x {k}]"),
            "q>bf16",
            mism as f64,
            0.0,
        );
        // Grouped expert GEMM over quantized experts == over their bf16 dequantization (not
        // on the 17,000-row matrix: its f64 references would take the test's time).
        if gpu.has_flash_attn() && rows <= 4096 {
            for t in [7usize, 300] {
                let (kk, held) = (2usize, 3usize);
                let ids: Vec<i32> = (0..t * kk).map(|_| rng.below(held) as i32).collect();
                let idd = gpu.upload(&ids).unwrap();
                let sorted = gpu.moe_sort(t * kk, idd.ptr(), 0, held).unwrap();
                let qptrs = gpu.upload(&[wd.w.ptr(), w2.w.ptr(), wd.w.ptr()]).unwrap();
                let bptrs = gpu.upload(&[deq.ptr(), deq.ptr(), deq.ptr()]).unwrap();
                let xt: Vec<u16> = rng.vec(t * k, 1.0).iter().map(|&v| bf(v)).collect();
                let xs = gpu.upload(&xt).unwrap();
                let mut outs = Vec::new();
                for (wty, p) in [(Some(ty), &qptrs), (None, &bptrs)] {
                    let out = poisoned::<f32>(gpu, t * kk * rows);
                    gpu.moe_gemm_tiles(
                        &sorted,
                        wty,
                        p.ptr(),
                        xs.ptr(),
                        kk,
                        true,
                        rows,
                        k,
                        out.ptr(),
                    )
                    .unwrap();
                    outs.push(gpu.to_host(&out).unwrap());
                }
                let mism = outs[0]
                    .iter()
                    .zip(&outs[1])
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                rep.check(
                    "moe_gemm quantized",
                    format!("{ty:?} [{rows} x {k}] pairs{}", t * kk),
                    "q>bf16>f32",
                    mism as f64,
                    0.0,
                );
                // The int8 tensor-core kernel (`moe_gemm`'s path where k % 256 == 0): sorted
                // row r against the CPU dequantization of its expert times its x row quantized
                // as the kernel takes it (Q8_0 per 32 values, Q4_K by q8u), in f64. Experts: this matrix, another one, none (zeros); x rows
                // gathered (pair / 2) and, at 7 tokens, given in sorted order.
                if gpu.moe_mmq_fits(k) {
                    let qm2 = QMatrix::quantize_from_f32(ggml, rows, k, &rng.vec(rows * k, 0.05))
                        .unwrap();
                    let wf2 = qm2.to_f32();
                    let wq2 = gpu.upload_qmat(ty, rows, k, qm2.data()).unwrap();
                    let mptrs = gpu.upload(&[wd.w.ptr(), wq2.w.ptr(), 0]).unwrap();
                    let order = gpu.to_host(&sorted.order).unwrap();
                    // x rows (bf16 bits) quantized by the kernel's rule, as f64 values
                    let quant = |xb: &[u16]| -> Vec<f64> {
                        let xf: Vec<f32> = xb
                            .iter()
                            .map(|&b| f32::from_bits((b as u32) << 16))
                            .collect();
                        if x_q8u(ty) == 1 {
                            let (q, u, d) = q8u_host(&xf);
                            return (q.iter().enumerate())
                                .map(|(i, &v)| v as f64 * u[i / 32] as f64 * d[i / 256] as f64)
                                .collect();
                        }
                        let (q, d) = q8_host(&xf);
                        (q.iter().enumerate())
                            .map(|(i, &v)| v as f64 * d[i / 32] as f64)
                            .collect()
                    };
                    let xp: Vec<u16> = rng.vec(t * kk * k, 1.0).iter().map(|&v| bf(v)).collect();
                    let xpd = gpu.upload(&xp).unwrap();
                    let gathers: &[bool] = if t <= 8 { &[true, false] } else { &[true] };
                    for &gather in gathers {
                        let (xd, xq) = if gather {
                            (xs.ptr(), quant(&xt))
                        } else {
                            (xpd.ptr(), quant(&xp))
                        };
                        let out = poisoned::<f32>(gpu, t * kk * rows);
                        gpu.moe_mmq(&sorted, ty, mptrs.ptr(), xd, kk, gather, rows, k, out.ptr())
                            .unwrap();
                        let got = gpu.to_host(&out).unwrap();
                        let want: Vec<f32> = (0..t * kk * rows)
                            .into_par_iter()
                            .map(|i| {
                                let (r, c) = (i / rows, i % rows);
                                let p = order[r] as usize;
                                let src = if gather { p / kk } else { r };
                                let w = match ids[p] {
                                    0 => &wf,
                                    1 => &wf2,
                                    _ => return 0.0,
                                };
                                (0..k)
                                    .map(|j| w[c * k + j] as f64 * xq[src * k + j])
                                    .sum::<f64>() as f32
                            })
                            .collect();
                        rep.check(
                            "moe_mmq",
                            format!("{ty:?} [{rows} x {k}] pairs{} gather {gather}", t * kk),
                            "q*i8>f32",
                            rel_err(&got, &want),
                            1e-4,
                        );
                    }
                }
            }
        }
    }
}
