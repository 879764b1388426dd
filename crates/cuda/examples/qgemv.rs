//! Kernel lab: products over GGUF weights kept compressed (Q8_0, Q4_K; `kernels/qgemv.cu`)
//! against the same products over bf16 weights.
//!
//! 1. Products with M = 1, 2, 4, 8, 16, 64 rows of x (`--m`): at M = 1 every int8 GEMV variant
//!    (x quantized per 32 values in the kernel, dp4a), at M > 1 each path on its own (the int8
//!    tensor-core kernel `qgemm_mmq`, the bf16 one `qgemm_tc`, the GEMV), then at every M the
//!    executor's call (`qgemm`, `QPath::choose`), against cuBLAS bf16 with m = M
//!    (`Gemm::plain`) and, at M = 1, the
//!    in-house bf16 warp GEMV (`moe_gemv`). Shapes: DeepSeek-V2-Lite's q_proj, o_proj and MLP
//!    (gate_up 21888 x 2048, down 2048 x 10944) and V3's MLP (18432 x 7168, 7168 x 18432).
//!    Figure of merit: bytes moved (W as stored + x bf16 + out f32) over time, against the
//!    H200's measured copy ceiling (3,970 GB/s); the target is the quantized kernels within
//!    10% of the bf16 kernels' bandwidth.
//! 2. Grouped expert GEMM (V2-Lite experts: 64 x gate_up [2816, 2048], top-6) at 16, 64 and
//!    512 tokens (`--grouped`), bf16 against the quantized variants (tiles dequantized in
//!    shared memory, and the int8 tensor-core kernel).
//!
//! Weights are random (valid f16 scales, random quants), and each launch uses the next of
//! several copies of W (>= 2 GiB together) so L2 (50 MB) cannot serve them. Timing: CUDA
//! events (`CU_EVENT_DEFAULT`) around batches of back-to-back launches, median of 15 batches
//! after 3 warm-ups. Before timing, every GEMV variant is checked on a poisoned output: 64
//! sampled rows against the CPU dequantizer times the quantized x in f64 (bound 1e-4
//! relative), each path at M > 1 likewise against x as it quantizes it (the int8 kernels:
//! per 32 values, Q4_K's tensor-core kernel q8u; bound 1e-4) or x itself (`qgemm_tc`: 1e-2),
//! and `qgemm` against the exact product (bound 1e-2, printed); a failing one is reported and
//! not timed. Results: bench/cuda/qgemv.md.
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example qgemv -- [--json out.json] [--shape i,j] [--m 1,2,4] [--grouped]
//! ```

#[path = "common/mod.rs"]
mod common;

use common::{random_bf16, xorshift_bytes};
use mlaserve_backend::{Bytes, GgmlType, QMatrix};
use mlaserve_cuda::ops::{Gemm, GemmType};
use mlaserve_cuda::qgemv::{QMat, QType, QmvVariant};
use mlaserve_cuda::qmmq::{q8u_host, x_q8u};
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

/// [`time`] of `run` inside a step, as the executor calls it (scratch from the step's arena).
fn time_step(
    gpu: &Gpu,
    run: &dyn Fn(usize) -> mlaserve_cuda::error::Result<()>,
    per: usize,
) -> Res<f64> {
    time(
        gpu,
        &|i| {
            gpu.begin_step();
            let r = run(i);
            gpu.end_step();
            r
        },
        15,
        per,
    )
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

/// x [m, k] quantized and dequantized again by the kernels' rule (per 32 values:
/// d = amax / 127, q = round(x / d)): the x the int8 GEMV multiplies by.
fn quantized_x(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (blk, o) in x.chunks(32).zip(out.chunks_mut(32)) {
        let d = blk.iter().fold(0f32, |a, &v| a.max(v.abs())) / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (v, o) in blk.iter().zip(o) {
            *o = (v * id).round() * d;
        }
    }
    out
}

/// x [m, k] (k % 256 == 0) quantized and dequantized again as the int8 tensor-core kernel
/// takes it against Q4_K (`qmmq::x_q8u`, the host rule `q8u_host`).
fn quantized_x_q8u(x: &[f32]) -> Vec<f32> {
    let (q, u, d) = q8u_host(x);
    (q.iter().enumerate())
        .map(|(i, &q)| (q as f64 * u[i / 32] as f64 * d[i / 256] as f64) as f32)
        .collect()
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
    // --shape i[,j...]: only these shapes (and no grouped GEMM)
    let only_shape: Option<Vec<usize>> = arg("--shape")
        .map(|s| s.split(',').map(|v| v.parse()).collect::<Result<_, _>>())
        .transpose()?;
    let shapes = [
        ("V2-Lite q_proj", 3072usize, 2048usize),
        ("V2-Lite o_proj", 2048, 2048),
        ("V2-Lite gate_up", 21888, 2048),
        ("V2-Lite down", 2048, 10944),
        ("V3 gate/up", 18432, 7168),
        ("V3 down", 7168, 18432),
        // as many bf16 bytes as V3 down holds in Q4_K (73.4 against 74.3 MB): how a bf16
        // GEMV streams a matrix of that size
        ("V3 down, Q4_K's bytes", 7168, 5120),
        // as many bf16 bytes as V2-Lite gate_up holds in Q4_K (25.17 against 25.21 MB)
        ("V2-Lite gate_up, Q4_K's bytes", 6144, 2048),
        // V3's shared expert gate|up and q_a: few row blocks, long K (how the int8 kernel's
        // split along K deals them)
        ("V3 shared gate|up", 4096, 7168),
        ("V3 q_a", 1536, 7168),
    ];
    let ms: Vec<usize> = match arg("--m") {
        Some(list) => list
            .split(',')
            .map(|v| v.parse())
            .collect::<Result<_, _>>()?,
        None => vec![1, 2, 4, 8, 16, 64],
    };
    let mut rows_json = Vec::new();
    let mut table = Vec::new();
    for (si, &(name, rows, k)) in shapes.iter().enumerate() {
        if only_shape.as_ref().is_some_and(|v| !v.contains(&si)) {
            continue;
        }
        println!("== {name}: [{rows} x {k}]");
        let x_bits = random_bf16(64 * k, 7 + si as u64);
        let x: Vec<f32> = x_bits
            .iter()
            .map(|&b| half::bf16::from_bits(b).to_f32())
            .collect();
        let xd = gpu.upload(&x_bits)?;
        let xq = quantized_x(&x);
        let xq8u = if k % 256 == 0 {
            quantized_x_q8u(&x)
        } else {
            xq.clone()
        };
        let out = gpu.alloc_filled::<f32>(64 * rows, 0xff)?;
        // bf16 peer: cuBLAS and the warp GEMV.
        let wb = gpu.upload(&random_bf16(rows * k, 11 + si as u64))?;
        let nb = ROTATE_BYTES.div_ceil(wb.bytes()).clamp(2, 64);
        let wbs = replicate(&gpu, &wb, nb)?;
        drop(wb);
        let ptrs: Vec<DBuf<u64>> = wbs
            .iter()
            .map(|w| gpu.upload(&[w.ptr()]))
            .collect::<Result<_, _>>()?;
        let ids = gpu.upload(&[0i32; 64])?;
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
                .map(|w| {
                    let ptr = gpu.upload(&[w.ptr()])?;
                    Ok(QMat {
                        ty,
                        rows,
                        cols: k,
                        w,
                        ptr,
                    })
                })
                .collect::<Res<_>>()?;
            let sample: Vec<usize> = (0..64).map(|i| (i * 7919 + 3) % rows).collect();
            for &m in &ms {
                let bytes = (cpu.data().len() + m * k * 2 + m * rows * 4) as f64;
                let mut best: Option<(f64, String)> = None;
                // M = 1: every int8 GEMV variant on a quantized x.
                for v in QmvVariant::ALL
                    .iter()
                    .copied()
                    .filter(|v| m == 1 && v.mt == 1)
                {
                    let is_default = Some(v) == QmvVariant::for_m(ty, 1);
                    let label = format!(
                        "qmv {}{}",
                        v.kernel(ty).rsplit('_').next().unwrap_or(""),
                        if is_default { " (default)" } else { "" }
                    );
                    // Check on copy 0 with a poisoned output.
                    gpu.sync()?;
                    let o = gpu.alloc_filled::<f32>(rows, 0xff)?;
                    gpu.qmv_variant(&qs[0], xd.ptr(), 0, 1, o.ptr(), false, v, None)?;
                    let got = gpu.to_host(&o)?;
                    let err = check(&cpu, &xq, 1, &got, &sample);
                    let err_x = check(&cpu, &x, 1, &got, &sample);
                    if err.is_nan() || err > 1e-4 {
                        println!("M{m} {ty:?} {label}: error {err:.3e} past 1e-4; not timed");
                        rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} {label}"), "rel_err": err, "failed": true}));
                        continue;
                    }
                    let us = time(
                        &gpu,
                        &|i| {
                            gpu.qmv_variant(&qs[i % nq], xd.ptr(), 0, 1, out.ptr(), false, v, None)
                        },
                        15,
                        nq.max(16),
                    )?;
                    let gbs = bytes / us * 1e-3;
                    let ratio = gbs / bf16_gbs[&m];
                    println!(
                        "M{m} {ty:?} {label:<16} {us:8.1} µs {gbs:6.0} GB/s ({:4.1}% of copy, {:5.3} x bf16 cuBLAS) err {err:.1e} (vs bf16 x {err_x:.1e})",
                        100.0 * gbs / COPY_GBS,
                        ratio
                    );
                    rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} {label}"), "variant": v.kernel(ty), "default": is_default, "us_median": us, "gb_s": gbs, "bytes": bytes, "rel_err": err, "rel_err_vs_bf16_x": err_x, "vs_bf16_cublas": ratio}));
                    if best.as_ref().is_none_or(|b| us < b.0) {
                        best = Some((us, label));
                    }
                }
                // M = 1: the default and three-CTA kernels on grids that give every warp the
                // same number of row groups (qgemv::even_grid).
                if m == 1 {
                    for v in [
                        QmvVariant::for_m(ty, 1).expect("one vector"),
                        QmvVariant::WIDE3,
                    ] {
                        let cap = gpu.qmv_even_grid(&qs[0], v)?;
                        gpu.sync()?;
                        let o = gpu.alloc_filled::<f32>(rows, 0xff)?;
                        gpu.qmv_variant(&qs[0], xd.ptr(), 0, 1, o.ptr(), false, v, Some(cap))?;
                        let err = check(&cpu, &xq, 1, &gpu.to_host(&o)?, &sample);
                        let label = format!("{} even {cap}", v.kernel(ty));
                        if err.is_nan() || err > 1e-4 {
                            println!("M1 {ty:?} {label}: error {err:.3e} past 1e-4; not timed");
                            continue;
                        }
                        let us = time(
                            &gpu,
                            &|i| {
                                gpu.qmv_variant(
                                    &qs[i % nq],
                                    xd.ptr(),
                                    0,
                                    1,
                                    out.ptr(),
                                    false,
                                    v,
                                    Some(cap),
                                )
                            },
                            15,
                            nq.max(16),
                        )?;
                        let gbs = bytes / us * 1e-3;
                        println!(
                            "M1 {ty:?} {label:<34} {us:8.1} µs {gbs:6.0} GB/s ({:5.3} x bf16)",
                            gbs / bf16_gbs[&m]
                        );
                        rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": label, "grid_cap": cap, "us_median": us, "gb_s": gbs, "bytes": bytes, "rel_err": err}));
                    }
                }
                // M = 1 on a gate|up: the SwiGLU in the GEMV's epilogue (one launch, act
                // bf16 [rows / 2]) against the GEMV into f32 then silu_mul (two), checked
                // bit for bit first.
                if m == 1 && name.contains("gate") && gpu.qmv_glu_on() {
                    let f = rows / 2;
                    let (want, got) = (gpu.alloc::<u16>(f)?, gpu.alloc::<u16>(f)?);
                    gpu.qmv(&qs[0], xd.ptr(), 0, 1, out.ptr(), false)?;
                    gpu.silu_mul(out.ptr(), want.ptr(), f, 1)?;
                    gpu.qmv_glu(&qs[0], xd.ptr(), 0, got.ptr())?;
                    let diff = (gpu.to_host(&want)?.iter())
                        .zip(gpu.to_host(&got)?.iter())
                        .filter(|(a, b)| a != b)
                        .count();
                    if diff != 0 {
                        println!("M1 {ty:?} qmv_glu: {diff} of {f} outputs differ; not timed");
                    } else {
                        let two = |i: usize| {
                            gpu.qmv(&qs[i % nq], xd.ptr(), 0, 1, out.ptr(), false)?;
                            gpu.silu_mul(out.ptr(), want.ptr(), f, 1)
                        };
                        let one = |i: usize| gpu.qmv_glu(&qs[i % nq], xd.ptr(), 0, got.ptr());
                        for (label, us) in [
                            ("qmv + silu_mul", time(&gpu, &two, 15, nq.max(16))?),
                            ("qmv_glu", time(&gpu, &one, 15, nq.max(16))?),
                        ] {
                            println!("M1 {ty:?} {label:<34} {us:8.1} µs (SwiGLU, act bf16)");
                            rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": label, "us_median": us, "swiglu": true}));
                        }
                    }
                }
                // Q4_K at M = 1: the walks with the loads alone.
                if m == 1 && ty == QType::Q4K {
                    lab_q4k(
                        &gpu,
                        &qs,
                        xd.ptr(),
                        out.ptr(),
                        bytes,
                        bf16_gbs[&m],
                        name,
                        &mut rows_json,
                    )?;
                }
                if let Some((us, label)) = best {
                    let gbs = bytes / us * 1e-3;
                    table.push(format!(
                        "| {name} | {rows} x {k} | {m} | {ty:?} | best {label} | {us:.1} | {gbs:.0} | {:.0} | {:.3} |",
                        bf16_gbs[&m],
                        gbs / bf16_gbs[&m]
                    ));
                }
                // M > 1: each path on its own — the int8 tensor-core kernel (`qgemm_mmq`,
                // against the quantized x: bound 1e-4), the bf16 tensor-core kernel
                // (`qgemm_tc`, against x: 1e-2) and the GEMV up to 8 rows (1e-4) — checked on
                // copy 0, then timed inside a step.
                if m > 1 {
                    type Path<'a> = (
                        &'a str,
                        bool,
                        Box<dyn Fn(&QMat, u64) -> mlaserve_cuda::error::Result<()> + 'a>,
                    );
                    let paths: [Path; 3] = [
                        (
                            "qgemm_mmq",
                            gpu.mmq_fits(&qs[0], m),
                            Box::new(|w: &QMat, o| gpu.qgemm_mmq(w, m, xd.ptr(), o, false)),
                        ),
                        (
                            "qgemm_tc",
                            gpu.has_flash_attn() && m <= 64,
                            Box::new(|w: &QMat, o| gpu.qgemm_tc(w, m, xd.ptr(), o, false)),
                        ),
                        (
                            "qmv",
                            m <= QmvVariant::MAX_M,
                            Box::new(|w: &QMat, o| gpu.qmv(w, xd.ptr(), 0, m, o, false)),
                        ),
                    ];
                    for (label, ok, f) in &paths {
                        if !ok {
                            continue;
                        }
                        gpu.sync()?;
                        let o = gpu.alloc_filled::<f32>(m * rows, 0xff)?;
                        gpu.begin_step();
                        f(&qs[0], o.ptr())?;
                        gpu.end_step();
                        let got = gpu.to_host(&o)?;
                        let (err, bound) = match *label {
                            "qgemm_tc" => (check(&cpu, &x, m, &got, &sample), 1e-2),
                            "qgemm_mmq" if x_q8u(ty) == 1 => {
                                (check(&cpu, &xq8u, m, &got, &sample), 1e-4)
                            }
                            _ => (check(&cpu, &xq, m, &got, &sample), 1e-4),
                        };
                        if err.is_nan() || err > bound {
                            println!(
                                "M{m} {ty:?} {label}: error {err:.3e} past {bound:.0e}; not timed"
                            );
                            rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} {label}"), "rel_err": err, "failed": true}));
                            continue;
                        }
                        let us = time_step(&gpu, &|i| f(&qs[i % nq], out.ptr()), nq.max(16))?;
                        let gbs = bytes / us * 1e-3;
                        let ratio = gbs / bf16_gbs[&m];
                        let split = match *label {
                            "qgemm_mmq" => format!(" {} splits", gpu.qgemm_mmq_splits(&qs[0], m)?),
                            _ => String::new(),
                        };
                        println!("M{m} {ty:?} {label:<10} {us:8.1} µs {gbs:6.0} GB/s ({ratio:5.3} x bf16 cuBLAS) err {err:.1e}{split}");
                        rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} {label}"), "us_median": us, "gb_s": gbs, "bytes": bytes, "rel_err": err, "vs_bf16_cublas": ratio}));
                    }
                }
                // M > 1 (the GEMV over 2-8 rows or the tensor-core kernel, as `qgemm` picks):
                // check against the exact product.
                if m > 1 {
                    gpu.sync()?;
                    let o = gpu.alloc_filled::<f32>(m * rows, 0xff)?;
                    gpu.qgemm(&qs[0], m, xd.ptr(), o.ptr(), false)?;
                    let err = check(&cpu, &x, m, &gpu.to_host(&o)?, &sample);
                    println!("M{m} {ty:?} qgemm error {err:.2e} against the exact product (int8 x or bf16 weights: bound 1e-2)");
                    if err.is_nan() || err > 1e-2 {
                        rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} qgemm"), "rel_err": err, "failed": true}));
                        continue;
                    }
                }
                // The executor's call (`qgemm`: QPath::choose picks GEMV, tensor core or cuBLAS).
                let us = time_step(
                    &gpu,
                    &|i| gpu.qgemm(&qs[i % nq], m, xd.ptr(), out.ptr(), false),
                    nq.max(16),
                )?;
                let gbs = bytes / us * 1e-3;
                let ratio = gbs / bf16_gbs[&m];
                println!(
                    "M{m} {ty:?} qgemm {us:8.1} µs {gbs:6.0} GB/s ({ratio:5.3} x bf16 cuBLAS)"
                );
                rows_json.push(serde_json::json!({"shape": name, "rows": rows, "k": k, "m": m, "kernel": format!("{ty:?} qgemm"), "us_median": us, "gb_s": gbs, "bytes": bytes, "vs_bf16_cublas": ratio}));
                table.push(format!(
                    "| {name} | {rows} x {k} | {m} | {ty:?} | qgemm | {us:.1} | {gbs:.0} | {:.0} | {ratio:.3} |",
                    bf16_gbs[&m]
                ));
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
    if only_shape.is_none() || std::env::args().any(|a| a == "--grouped") {
        grouped(&gpu, &mut rows_json, &mut table)?;
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

/// The `lab_q4k_*_loads` kernels of qgemv.cu on the same matrices (`qs`, rotated copies): the
/// two M = 1 kernels' walks with the loads alone, on the full grid and on the even one. They
/// compute no product, so they are timed, not checked: the ceiling of the walk itself.
#[allow(clippy::too_many_arguments)]
fn lab_q4k(
    gpu: &Gpu,
    qs: &[QMat],
    x: u64,
    out: u64,
    bytes: f64,
    bf16_gbs: f64,
    shape: &str,
    rows_json: &mut Vec<serde_json::Value>,
) -> Res<()> {
    let (rows, k, n) = (qs[0].rows, qs[0].cols, qs.len());
    for (name, v) in [
        (
            "lab_q4k_r2m1w_loads",
            QmvVariant::for_m(QType::Q4K, 1).expect("one vector"),
        ),
        ("lab_q4k_r2m1w3_loads", QmvVariant::WIDE3),
    ] {
        for cap in [None, Some(gpu.qmv_even_grid(&qs[0], v)?)] {
            let label = match cap {
                Some(c) => format!("{name} even {c}"),
                None => name.to_string(),
            };
            let us = time(
                gpu,
                &|i| gpu.qmv_lab(name, &qs[i % n], x, out, v, cap),
                15,
                n.max(16),
            )?;
            let gbs = bytes / us * 1e-3;
            println!(
                "M1 Q4K {label:<34} {us:8.1} µs {gbs:6.0} GB/s ({:5.3} x bf16) (ablation: no product)",
                gbs / bf16_gbs
            );
            rows_json.push(serde_json::json!({"shape": shape, "rows": rows, "k": k, "m": 1, "kernel": label, "grid_cap": cap, "us_median": us, "gb_s": gbs, "bytes": bytes, "checked": false}));
        }
    }
    // The same walk through shared memory (cp.async.bulk into DEPTH slots a warp): the same
    // sums as r2m1w bit for bit (a row's lanes add the same steps in the same order), checked
    // before they are timed.
    if !gpu.has_clusters() {
        return Ok(());
    }
    let want = gpu.alloc_filled::<f32>(rows, 0xff)?;
    let v = QmvVariant::for_m(QType::Q4K, 1).expect("one vector");
    gpu.qmv_variant(&qs[0], x, 0, 1, want.ptr(), false, v, None)?;
    let want = gpu.to_host(&want)?;
    // (kernel, slots; 0: the engine's kernel of that name, through qmv_variant)
    // (kernel, the engine's kernel its slots and CTAs are; "... even": on the even grid)
    let (b2, b3) = (QmvVariant::BULK, QmvVariant::BULK3);
    for (name, v) in [
        ("qmv_q4_k_r2m1b", b2),
        ("qmv_q4_k_r2m1b even", b2),
        ("qmv_q4_k_r2m1b3", b3),
        ("lab_q4k_r2m1w_bulk4q", b2),
        ("lab_q4k_r2m1w3_bulk3q", b3),
        ("lab_q4k_r2m1w_bulk4_loads", b2),
    ] {
        let kernel = name.trim_end_matches(" even");
        let cap = if name.ends_with(" even") {
            Some(gpu.qmv_even_grid(&qs[0], v)?)
        } else {
            None
        };
        let run = |i: usize, out: u64| gpu.qmv_lab(kernel, &qs[i % n], x, out, v, cap);
        let loads = name.ends_with("_loads");
        if !loads {
            let got = gpu.alloc_filled::<f32>(rows, 0xff)?;
            if let Err(e) = run(0, got.ptr()) {
                println!("M1 Q4K {name}: {e}");
                continue;
            }
            let got = gpu.to_host(&got)?;
            let diff = want
                .iter()
                .zip(&got)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if diff != 0 {
                println!("M1 Q4K {name}: {diff} of {rows} rows differ from r2m1w's; not timed");
                rows_json.push(serde_json::json!({"shape": shape, "rows": rows, "k": k, "m": 1, "kernel": name, "failed": true}));
                continue;
            }
        }
        let us = time(gpu, &|i| run(i, out), 15, n.max(16))?;
        let gbs = bytes / us * 1e-3;
        let what = if loads {
            "(ablation: no product)"
        } else {
            "(bits = r2m1w)"
        };
        println!(
            "M1 Q4K {name:<34} {us:8.1} µs {gbs:6.0} GB/s ({:5.3} x bf16) {what}",
            gbs / bf16_gbs
        );
        rows_json.push(serde_json::json!({"shape": shape, "rows": rows, "k": k, "m": 1, "kernel": name, "us_median": us, "gb_s": gbs, "bytes": bytes, "checked": !loads}));
    }
    Ok(())
}

/// Section 2: the grouped expert GEMM over 64 V2-Lite experts (gate_up [2816, 2048]), top-6
/// routing of 16, 64 and 512 tokens, bf16 weights against Q8_0 and Q4_K. GB/s counts the
/// weights of the experts hit once (as stored) + x + out.
fn grouped(gpu: &Gpu, rows_json: &mut Vec<serde_json::Value>, table: &mut Vec<String>) -> Res<()> {
    let (experts, n, k, top) = (64usize, 2816usize, 2048usize, 6usize);
    if !gpu.has_flash_attn() {
        return Ok(());
    }
    // Weight sets: copies of all 64 experts, rotated so L2 cannot serve them.
    // (weights, bytes per expert, pointer table per copy, the copies' buffers)
    type Set = (Option<QType>, usize, Vec<DBuf<u64>>, Vec<Vec<DBuf<u8>>>);
    let mut sets: Vec<Set> = Vec::new();
    for wty in [None, Some(QType::Q8_0), Some(QType::Q4K)] {
        let per = wty.map_or(n * k * 2, |t| n * t.row_bytes(k));
        let copies = ROTATE_BYTES.div_ceil(per * experts).clamp(2, 8);
        let mut bufs = Vec::new();
        let mut ptrs = Vec::new();
        for c in 0..copies {
            let mut set = Vec::new();
            for e in 0..experts {
                let seed = 1000 + (c * experts + e) as u64;
                let b = match wty {
                    None => {
                        let v = random_bf16(n * k, seed);
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        gpu.upload(&bytes)?
                    }
                    Some(t) => gpu.upload_qmat(t, n, k, &random_blocks(t, n, k, seed))?.w,
                };
                set.push(b);
            }
            ptrs.push(gpu.upload(&set.iter().map(|b| b.ptr()).collect::<Vec<_>>())?);
            bufs.push(set);
        }
        sets.push((wty, per, ptrs, bufs));
    }
    for tokens in [16usize, 64, 512] {
        let pairs = tokens * top;
        let mut ids = Vec::with_capacity(pairs);
        for t in 0..tokens {
            // top-6 distinct experts per token, pseudo-random
            let mut picked = Vec::new();
            let mut s = (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            while picked.len() < top {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let e = (s % experts as u64) as i32;
                if !picked.contains(&e) {
                    picked.push(e);
                }
            }
            ids.extend(picked);
        }
        let hit = {
            let mut h = ids.clone();
            h.sort();
            h.dedup();
            h.len()
        };
        let idd = gpu.upload(&ids)?;
        let sorted = gpu.moe_sort(pairs, idd.ptr(), 0, experts)?;
        let x = gpu.upload(&random_bf16(tokens * k, 77))?;
        let out = gpu.alloc::<f32>(pairs * n)?;
        let mut bf16_us = 0.0;
        // bf16, then each quantized type on the tile kernel and on the int8 kernel (inside a
        // step: its quantized x comes from the arena).
        let runs = sets.iter().flat_map(|set| {
            let kinds: &[bool] = if set.0.is_some() {
                &[false, true]
            } else {
                &[false]
            };
            kinds.iter().map(move |&mmq| (set, mmq))
        });
        for ((wty, per, ptrs, _), mmq) in runs {
            let nc = ptrs.len();
            let us = time_step(
                gpu,
                &|i| {
                    let (p, xp, o) = (ptrs[i % nc].ptr(), x.ptr(), out.ptr());
                    match wty {
                        Some(t) if mmq => gpu.moe_mmq(&sorted, *t, p, xp, top, true, n, k, o),
                        // bf16 as the executor runs it (the wgmma kernel on sm_90a in 64-row
                        // tiles), not the tile kernel the quantized rows below take
                        None => gpu.moe_gemm(&sorted, None, p, xp, top, true, n, k, o),
                        _ => gpu.moe_gemm_tiles(&sorted, *wty, p, xp, top, true, n, k, o),
                    }
                },
                nc.max(16),
            )?;
            if wty.is_none() {
                bf16_us = us;
            }
            let bytes = (hit * per + tokens * k * 2 + pairs * n * 4) as f64;
            let gbs = bytes / us * 1e-3;
            let label = match wty {
                None => "bf16".to_string(),
                Some(t) => format!("{t:?} {}", if mmq { "mmq" } else { "tiles" }),
            };
            println!(
                "grouped {tokens:>3} tokens ({hit} experts hit) {label:<10} {us:8.1} µs {gbs:6.0} GB/s ({:.2}x the bf16 time)",
                us / bf16_us
            );
            rows_json.push(serde_json::json!({"section": "grouped", "tokens": tokens, "pairs": pairs, "experts_hit": hit, "n": n, "k": k, "weights": label, "us_median": us, "gb_s": gbs, "bytes": bytes, "time_vs_bf16": us / bf16_us}));
            table.push(format!(
                "| grouped 64 x [{n} x {k}] | {hit} experts hit | {tokens} tok | {label} | moe_gemm | {us:.1} | {gbs:.0} | - | {:.2}x time |",
                us / bf16_us
            ));
        }
    }
    Ok(())
}
