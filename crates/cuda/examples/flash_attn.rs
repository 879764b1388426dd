//! Kernel lab: causal prefill attention (the unabsorbed MLA path) at prefill shapes — the
//! tensor-core kernels of `flash_attn.cu` against the CUDA-core `attn_mha` — on random inputs
//! (uniform [-1, 1), one sequence per batch entry, dense causal lists), timed with CUDA events
//! around back-to-back launches (median of 5 batches of 3 after 2 warm-ups). Reported as
//! TFLOP/s: 2·(qk + v) FLOPs per (query, key, head) pair actually attended (causal, about
//! half the square), against the measured bf16 GEMM ceiling (804 TFLOP/s) and the peer
//! measured in the same run by bench/cuda/flash_attn_sdpa.py (torch SDPA: cuDNN,
//! FlashAttention-2, memory-efficient). Before timing, the tensor-core output is compared with
//! the CUDA-core kernel's (f32, checked against the CPU in the op table) on the same inputs;
//! past 2^-7 of the largest output it is reported and not timed. Results:
//! bench/cuda/flash_attn.md.
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example flash_attn -- [--json out.json] [--shape i]
//! ```

#[path = "common/mod.rs"]
mod common;

use common::random_f32;
use cudarc::driver::sys::CUfunction_attribute;
use mlaserve_cuda::flash_attn::{fa_all_variants, fa_tiles, FaVariant};
use mlaserve_cuda::ops::{AttnDims, KeyLists};
use mlaserve_cuda::Gpu;

const GEMM_TFS: f64 = 804.0;

/// max|a - b| / max|b|; NaN anywhere gives NaN.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() || y.is_nan() {
            return f64::NAN;
        }
        num = num.max((x as f64 - y as f64).abs());
        den = den.max((y as f64).abs());
    }
    num / den.max(f64::MIN_POSITIVE)
}

/// ms per call: 2 warm-ups, median of `batches` batches of `per` back-to-back calls.
fn time_ms(
    gpu: &Gpu,
    run: &dyn Fn() -> mlaserve_cuda::error::Result<()>,
    batches: usize,
    per: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    Ok(common::time_us(gpu, &|_| run(), 2, batches, per)? / 1e3)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::new(0)?;
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let json = arg("--json");
    let only_shape: Option<usize> = arg("--shape").and_then(|s| s.parse().ok());
    let mut kernels = Vec::new();
    for f in fa_all_variants() {
        let func = gpu.func(f.kernel)?;
        let regs = func.num_regs()?;
        let local = func.get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?;
        println!(
            "{}: dq {} dv {} keys/tile {}, {regs} registers, {local} B local, {} B shared",
            f.kernel,
            f.dq,
            f.dv,
            f.bn,
            f.smem_bytes()
        );
        kernels.push(serde_json::json!({"kernel": f.kernel, "dq": f.dq, "dv": f.dv, "bn": f.bn, "registers": regs, "local_bytes": local, "shared_bytes": f.smem_bytes()}));
    }
    // (batch, seq len, heads, P, R, V): DeepSeek-V2-Lite / V3 (qk 192 = 128 + 64, v 128) and
    // GLM-5 (qk 256 = 192 + 64, v 256).
    let shapes: [(usize, usize, usize, usize, usize, usize); 6] = [
        (1, 4096, 16, 128, 64, 128),
        (1, 8192, 16, 128, 64, 128),
        (4, 2048, 128, 128, 64, 128),
        (1, 8192, 16, 192, 64, 256),
        (1, 4096, 64, 192, 64, 256),
        (8, 512, 16, 128, 64, 128),
    ];
    let mut rows = Vec::new();
    for (si, &(b, len, n, p, r, v)) in shapes.iter().enumerate() {
        if only_shape.is_some_and(|o| o != si) {
            continue;
        }
        let t = b * len;
        let qk = p + r;
        let f: FaVariant = FaVariant::for_dims(qk, v).ok_or("no variant")?;
        let q = gpu.upload(&random_f32(t * n * qk, 1 + si as u64))?;
        let kn = gpu.upload(&random_f32(t * n * p, 2 + si as u64))?;
        let kpe = gpu.upload(&random_f32(t * r, 3 + si as u64))?;
        let vals = gpu.upload(&random_f32(t * n * v, 4 + si as u64))?;
        let n_keys_h: Vec<i32> = (0..t).map(|i| (i % len + 1) as i32).collect();
        let kv_base_h: Vec<i32> = (0..t).map(|i| (i / len * len) as i32).collect();
        let ranges: Vec<(usize, usize)> = (0..b).map(|s| (s * len, (s + 1) * len)).collect();
        let (nk, kvb) = (gpu.upload(&n_keys_h)?, gpu.upload(&kv_base_h)?);
        let sel_off = gpu.upload(&vec![-1i32; t])?;
        let sel_pos = gpu.upload(&[0i32])?;
        let d = AttnDims {
            t,
            heads: n,
            p,
            r,
            v,
            l: 0,
            scale: (qk as f32).powf(-0.5),
        };
        let keys = KeyLists {
            n_keys: nk.ptr(),
            sel_off: sel_off.ptr(),
            sel_pos: sel_pos.ptr(),
        };
        let flops: f64 =
            n_keys_h.iter().map(|&k| k as f64).sum::<f64>() * n as f64 * 2.0 * (qk + v) as f64;
        let tfs = |ms: f64| flops / ms / 1e9;
        let out_ref = gpu.alloc::<f32>(t * n * v)?;
        let run_ref = || {
            gpu.attn_mha(
                &d,
                q.ptr(),
                kn.ptr(),
                kpe.ptr(),
                vals.ptr(),
                out_ref.ptr(),
                &keys,
                kvb.ptr(),
            )
        };
        run_ref()?;
        let ref_h = gpu.to_host(&out_ref)?;
        let ms_ref = time_ms(&gpu, &run_ref, 3, 1)?;
        let shape = format!("B{b} len{len} N{n} qk{qk} v{v}");
        println!(
            "{shape}: CUDA-core attn_mha {ms_ref:.2} ms {:.1} TFLOP/s",
            tfs(ms_ref)
        );
        let (qb, kb, vb) = gpu.fa_pack(&d, &f, q.ptr(), kn.ptr(), kpe.ptr(), vals.ptr(), t)?;
        // In a step arena, as in the executor (no cuMemAlloc/cuMemFree per call).
        let run_pack = || {
            gpu.begin_step();
            let r = gpu
                .fa_pack(&d, &f, q.ptr(), kn.ptr(), kpe.ptr(), vals.ptr(), t)
                .map(|_| ());
            gpu.end_step();
            r
        };
        let ms_pack = time_ms(&gpu, &run_pack, 5, 3)?;
        // The executor's choice on this GPU (the wgmma kernel on sm_90a).
        let chosen = FaVariant::choose(qk, v, gpu.arch, true).ok_or("no variant")?;
        let variants = std::iter::once(f)
            .chain(fa_all_variants().filter(|x| {
                *x != f && x.dq == f.dq && x.dv == f.dv && gpu.fa_check(&d, x).is_ok()
            }));
        for fv in variants {
            let tiles_h = fa_tiles(&ranges, &n_keys_h, fv.bm());
            let n_tiles = tiles_h.len() / 2;
            let tiles = gpu.upload(&tiles_h)?;
            let out = gpu.alloc_filled::<f32>(t * n * v, 0xff)?;
            let run = || {
                gpu.attn_flash_packed(
                    &d,
                    &fv,
                    &qb,
                    &kb,
                    &vb,
                    out.ptr(),
                    tiles.ptr(),
                    n_tiles,
                    nk.ptr(),
                    kvb.ptr(),
                )
            };
            run()?;
            let err = rel_err(&gpu.to_host(&out)?, &ref_h);
            if err.is_nan() || err > 1.0 / 128.0 {
                println!(
                    "{shape}: {} rel err {err:.2e} vs CUDA-core: NOT TIMED",
                    fv.kernel
                );
                rows.push(serde_json::json!({"shape": shape, "kernel": fv.kernel, "rel_err_vs_cuda_core": err, "failed": true}));
                continue;
            }
            let ms = time_ms(&gpu, &run, 5, 3)?;
            println!(
                "{shape}: {}{} {ms:.3} ms {:.0} TFLOP/s ({:.0}% of GEMM), {:.0}x CUDA-core; + packing {ms_pack:.3} ms = {:.0} TFLOP/s; rel err {err:.2e}",
                fv.kernel,
                if fv == chosen { " (executor)" } else { "" },
                tfs(ms),
                100.0 * tfs(ms) / GEMM_TFS,
                ms_ref / ms,
                tfs(ms + ms_pack),
            );
            rows.push(serde_json::json!({"shape": shape, "batch": b, "len": len, "heads": n, "qk": qk, "v": v, "kernel": fv.kernel, "executor": fv == chosen, "ms": ms, "tflop_s": tfs(ms), "pack_ms": ms_pack, "tflop_s_with_pack": tfs(ms + ms_pack), "cuda_core_ms": ms_ref, "cuda_core_tflop_s": tfs(ms_ref), "rel_err_vs_cuda_core": err}));
        }
    }
    if let Some(p) = json {
        let doc = serde_json::json!({"gpu": gpu.name, "arch": gpu.arch, "flops": "sum over (query, key, head) attended of 2*(qk+v)", "kernels": kernels, "rows": rows});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
