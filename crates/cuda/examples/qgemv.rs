//! Kernel lab: quantized GEMV over raw GGUF blocks (Q8_0, Q4_K; `kernels/qgemv.cu`) against a
//! bf16 GEMV of the same shape through cuBLAS (`Gemm::plain`, m = M) and the in-house bf16
//! warp GEMV (`moe_gemv` on one expert, M = 1), at a DeepSeek-V2-Lite MLP (gate_up 21888 x
//! 2048, down 2048 x 10944) and a V3 one (18432 x 7168, 7168 x 18432), M = 1, 4, 8.
//!
//! Figure of merit: bytes moved (W as stored + x bf16 + out f32) over time, against the
//! H200's measured copy ceiling (3,970 GB/s); the target is the quantized kernels within 10%
//! of the bf16 kernels' bandwidth. Weights are random (valid f16 scales, random quants), and
//! each launch uses the next of several copies of W (>= 2 GiB together) so L2 (50 MB) cannot
//! serve them. Timing: CUDA events (`CU_EVENT_DEFAULT`) around batches of back-to-back
//! launches, median of 15 batches after 3 warm-ups. Before timing, every kernel variant and
//! K split is checked on fresh x: output poisoned with NaN (any unwritten row fails), 64
//! sampled rows against the CPU dequantizer times x in f64 (bound 1e-4 relative); a failing
//! one is reported and not timed. Results: bench/cuda/qgemv.md.
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example qgemv -- [--json out.json] [--shape i]
//! ```

#[path = "common/mod.rs"]
mod common;

use common::{random_bf16, xorshift_bytes};
use mlaserve_backend::{Bytes, GgmlType, QMatrix};
use mlaserve_cuda::ops::{Gemm, GemmType};
use mlaserve_cuda::qgemv::{QMat, QType, QgemvVariant};
use mlaserve_cuda::{DBuf, Gpu};
use rayon::prelude::*;

const COPY_GBS: f64 = 3970.0;
/// Copies of each weight matrix together hold at least this many bytes.
const ROTATE_BYTES: usize = 2 << 30;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Raw blocks of a random [rows, k] matrix of `ty`: random quants and scale bytes, f16
/// scales (d, dmin) set to finite values in [2^-10, 2^-7).
fn random_blocks(ty: QType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut b = xorshift_bytes(rows * ty.row_bytes(k), seed);
    let bb = ty.block_bytes();
    b.par_chunks_mut(bb).for_each(|blk| {
        let scales = if ty == QType::Q8_0 { 1 } else { 2 };
        for s in 0..scales {
            let r = u16::from_le_bytes([blk[2 * s], blk[2 * s + 1]]);
            let f = (1.0 + (r as f32 / 65536.0) * 7.0) / 1024.0;
            blk[2 * s..2 * s + 2].copy_from_slice(&half::f16::from_f32(f).to_le_bytes());
        }
    });
    b
}

/// µs per call, median of `batches` batches of `per` after 3 warm-ups (common::time_us).
fn time(
    gpu: &Gpu,
    run: &dyn Fn(usize) -> mlaserve_cuda::error::Result<()>,
    batches: usize,
    per: usize,
) -> Res<f64> {
    common::time_us(gpu, run, 3, batches, per)
}

/// `n` device copies of `src` (`bytes` bytes) made on the device.
fn replicate<T>(gpu: &Gpu, src: &DBuf<T>, n: usize) -> Res<Vec<DBuf<T>>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let d = gpu.alloc::<T>(src.len())?;
        // SAFETY: both buffers hold src.bytes() bytes.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                d.ptr(),
                src.ptr(),
                src.bytes(),
                gpu.stream.cu_stream(),
            )
        }?;
        v.push(d);
    }
    gpu.sync()?;
    Ok(v)
}

/// max over `sample` rows of |gpu - ref| / max |ref|, ref = CPU dequantized W times x in f64;
/// NaN (an unwritten or poisoned output) anywhere in `got` gives NaN.
fn check(cpu: &QMatrix, x: &[f32], m: usize, got: &[f32], sample: &[usize]) -> f64 {
    if got.iter().any(|v| v.is_nan()) {
        return f64::NAN;
    }
    let (rows, k) = (cpu.rows, cpu.cols);
    let (mut num, mut den) = (0f64, 0f64);
    let mut wr = vec![0f32; k];
    for &r in sample {
        cpu.dequantize_row(r, &mut wr);
        for mi in 0..m {
            let want: f64 = wr
                .iter()
                .zip(&x[mi * k..(mi + 1) * k])
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            num = num.max((got[mi * rows + r] as f64 - want).abs());
            den = den.max(want.abs());
        }
    }
    num / den.max(f64::MIN_POSITIVE)
}

fn main() -> Res<()> {
    let gpu = Gpu::new(0)?;
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let json = arg("--json");
    let only_shape: Option<usize> = arg("--shape").and_then(|s| s.parse().ok());
    let shapes = [
        ("V2-Lite gate_up", 21888usize, 2048usize),
        ("V2-Lite down", 2048, 10944),
        ("V3 gate/up", 18432, 7168),
        ("V3 down", 7168, 18432),
    ];
    let ms = [1usize, 4, 8];
    let mut rows_json = Vec::new();
    let mut table = Vec::new();
    for (si, &(name, rows, k)) in shapes.iter().enumerate() {
        if only_shape.is_some_and(|i| i != si) {
            continue;
        }
        println!("== {name}: [{rows} x {k}]");
        let x_bits = random_bf16(8 * k, 7 + si as u64);
        let x: Vec<f32> = x_bits
            .iter()
            .map(|&b| half::bf16::from_bits(b).to_f32())
            .collect();
        let xd = gpu.upload(&x_bits)?;
        let out = gpu.alloc_filled::<f32>(8 * rows, 0xff)?;
        // bf16 peer: cuBLAS and the warp GEMV.
        let wb = gpu.upload(&random_bf16(rows * k, 11 + si as u64))?;
        let nb = ROTATE_BYTES.div_ceil(wb.bytes()).clamp(2, 64);
        let wbs = replicate(&gpu, &wb, nb)?;
        drop(wb);
        let ptrs: Vec<DBuf<u64>> = wbs
            .iter()
            .map(|w| gpu.upload(&[w.ptr()]))
            .collect::<Result<_, _>>()?;
        let ids = gpu.upload(&[0i32; 8])?;
        let mut bf16_gbs = std::collections::HashMap::new();
        for &m in &ms {
            let bytes = (rows * k * 2 + m * k * 2 + m * rows * 4) as f64;
            let us = time(
                &gpu,
                &|i| {
                    gpu.gemm(&Gemm::plain(
                        GemmType::Bf16,
                        m,
                        rows,
                        k,
                        xd.ptr(),
                        wbs[i % nb].ptr(),
                        out.ptr(),
                    ))
                },
                15,
                nb.max(16),
            )?;
            let gbs = bytes / us * 1e-3;
            bf16_gbs.insert(m, gbs);
            println!("M{m} bf16 cuBLAS          {us:8.1} µs {gbs:6.0} GB/s");
            rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": "bf16 cuBLAS", "us_median": us, "gb_s": gbs, "bytes": bytes}));
            if m == 1 {
                let us = time(
                    &gpu,
                    &|i| {
                        gpu.moe_gemv(
                            1,
                            ptrs[i % nb].ptr(),
                            0,
                            1,
                            ids.ptr(),
                            xd.ptr(),
                            1,
                            k,
                            rows,
                            out.ptr(),
                        )
                    },
                    15,
                    nb.max(16),
                )?;
                let gbs = bytes / us * 1e-3;
                println!("M{m} bf16 warp GEMV       {us:8.1} µs {gbs:6.0} GB/s");
                rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": "bf16 moe_gemv", "us_median": us, "gb_s": gbs, "bytes": bytes}));
            }
        }
        drop(wbs);
        for ty in [QType::Q8_0, QType::Q4K] {
            if k % ty.block_values() != 0 {
                println!(
                    "{ty:?}: K = {k} is not a multiple of {}; skipped",
                    ty.block_values()
                );
                continue;
            }
            let ggml = if ty == QType::Q8_0 {
                GgmlType::Q8_0
            } else {
                GgmlType::Q4_K
            };
            let host = random_blocks(ty, rows, k, 13 + si as u64);
            let cpu = QMatrix::new(ggml, rows, k, Bytes::from_vec(host))?;
            let q0 = gpu.upload_qmat(ty, rows, k, cpu.data())?;
            let nq = ROTATE_BYTES.div_ceil(q0.w.bytes()).clamp(2, 64);
            let qs: Vec<QMat> = replicate(&gpu, &q0.w, nq)?
                .into_iter()
                .map(|w| QMat {
                    ty,
                    rows,
                    cols: k,
                    w,
                })
                .collect();
            let sample: Vec<usize> = (0..64).map(|i| (i * 7919 + 3) % rows).collect();
            for &m in &ms {
                let bytes = (cpu.data().len() + m * k * 2 + m * rows * 4) as f64;
                let mut best: Option<(f64, String)> = None;
                let mut variants: Vec<(QgemvVariant, usize, bool)> = Vec::new();
                let dflt = QgemvVariant::for_m(m).ok_or("no default kernel")?;
                let dks = dflt.default_ksplit(ty, rows, k);
                for v in QgemvVariant::ALL.iter().copied().filter(|v| v.mt >= m) {
                    for ks in [1usize, 2, 4, 8] {
                        variants.push((v, ks, v == dflt && ks == dks));
                    }
                }
                for (v, ks, is_default) in variants {
                    let label = format!(
                        "m{}r{} ks{ks}{}",
                        v.mt,
                        v.r,
                        if is_default { " (default)" } else { "" }
                    );
                    // Check on copy 0 with a poisoned output.
                    gpu.sync()?;
                    let o = gpu.alloc_filled::<f32>(m * rows, 0xff)?;
                    gpu.qgemv_variant(&qs[0], m, xd.ptr(), o.ptr(), false, v, ks, None)?;
                    let err = check(&cpu, &x, m, &gpu.to_host(&o)?, &sample);
                    if err.is_nan() || err > 1e-4 {
                        println!("M{m} {ty:?} {label}: error {err:.3e} past 1e-4; not timed");
                        rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} {label}"), "rel_err": err, "failed": true}));
                        continue;
                    }
                    let us = time(
                        &gpu,
                        &|i| {
                            gpu.qgemv_variant(
                                &qs[i % nq],
                                m,
                                xd.ptr(),
                                out.ptr(),
                                false,
                                v,
                                ks,
                                None,
                            )
                        },
                        15,
                        nq.max(16),
                    )?;
                    let gbs = bytes / us * 1e-3;
                    let ratio = gbs / bf16_gbs[&m];
                    println!(
                        "M{m} {ty:?} {label:<22} {us:8.1} µs {gbs:6.0} GB/s ({:4.1}% of copy, {:5.3} x bf16 cuBLAS) err {err:.1e}",
                        100.0 * gbs / COPY_GBS,
                        ratio
                    );
                    rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} {label}"), "variant": format!("m{}r{}", v.mt, v.r), "ksplit": ks, "default": is_default, "us_median": us, "gb_s": gbs, "bytes": bytes, "rel_err": err, "vs_bf16_cublas": ratio}));
                    if is_default {
                        table.push(format!(
                            "| {name} | {rows} x {k} | {m} | {ty:?} | default {label} | {us:.1} | {gbs:.0} | {:.0} | {ratio:.3} |",
                            bf16_gbs[&m]
                        ));
                    }
                    if best.as_ref().is_none_or(|b| us < b.0) {
                        best = Some((us, label));
                    }
                }
                if let Some((us, label)) = best {
                    let gbs = bytes / us * 1e-3;
                    table.push(format!(
                        "| {name} | {rows} x {k} | {m} | {ty:?} | best {label} | {us:.1} | {gbs:.0} | {:.0} | {:.3} |",
                        bf16_gbs[&m],
                        gbs / bf16_gbs[&m]
                    ));
                }
            }
            // The dequantize kernel: blocks in, bf16 out.
            let dq = gpu.alloc::<u16>(rows * k)?;
            let us = time(
                &gpu,
                &|i| gpu.dequant_bf16(&qs[i % nq], dq.ptr()),
                15,
                nq.max(16),
            )?;
            let bytes = (cpu.data().len() + rows * k * 2) as f64;
            let gbs = bytes / us * 1e-3;
            println!("{ty:?} dequant -> bf16     {us:8.1} µs {gbs:6.0} GB/s");
            rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "kernel": format!("{ty:?} dequant_bf16"), "us_median": us, "gb_s": gbs, "bytes": bytes}));
            table.push(format!(
                "| {name} | {rows} x {k} | - | {ty:?} | dequant -> bf16 | {us:.1} | {gbs:.0} | - | - |"
            ));
        }
    }
    println!();
    println!("| shape | rows x K | M | type | kernel | µs | GB/s | bf16 cuBLAS GB/s | ratio |");
    println!("| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |");
    for l in &table {
        println!("{l}");
    }
    if let Some(p) = json {
        let doc = serde_json::json!({"gpu": gpu.name, "arch": gpu.arch, "copy_ceiling_gb_s": COPY_GBS, "bytes": "W as stored + x bf16 [M, K] + out f32 [M, rows]", "rows": rows_json});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
