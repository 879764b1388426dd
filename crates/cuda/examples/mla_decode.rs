//! Kernel lab: absorbed MLA decode at serving shapes — the CUDA-core kernel
//! (`attn_mqa_split` + combine) and every tensor-core variant of `mla_decode.cu`, over a split
//! sweep — on random inputs (bf16 cache in shuffled 64-row pages, f32 queries), timed with
//! CUDA events around batches of back-to-back launches (median of 7 batches of 10 after 3
//! warm-ups; 3 of 3 for the slow CUDA-core kernel). Reported as effective bandwidth (bytes of
//! cache rows, q and out over time) and TFLOP/s against the machine's measured ceilings
//! (3,970 GB/s copy, 804 TFLOP/s bf16 GEMM; ../shared/design/gpu.md). Before timing, each
//! tensor-core variant's output is compared with the CUDA-core kernel's on the same inputs
//! (the op table checks both against the CPU; a variant past 2^-7, one bf16 ulp of the
//! largest output, is reported and not timed) and with its own second run (bit-exact, else
//! reported: a race). Results: bench/cuda/mla_decode.md.
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example mla_decode -- [--json out.json]
//!     [--no-bulk] [--shape i] [--variant M1S3Q] [--ablate]
//! ```

#[path = "common/mod.rs"]
mod common;

use common::{random_bf16, random_f32, time_us};
use cudarc::driver::sys::CUfunction_attribute;
use mlaserve_cuda::mla_decode::{Early, MlaVariant, W64_ABLATIONS};
use mlaserve_cuda::ops::{AttnDims, KeyLists};
use mlaserve_cuda::{DBuf, Gpu};

const COPY_GBS: f64 = 3970.0;
const GEMM_TFS: f64 = 804.0;

/// max|a - b| / max|b| over bf16 outputs; NaN anywhere gives NaN.
fn rel_err(a: &[u16], b: &[u16]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (
            half::bf16::from_bits(x).to_f64(),
            half::bf16::from_bits(y).to_f64(),
        );
        if x.is_nan() || y.is_nan() {
            return f64::NAN;
        }
        num = num.max((x - y).abs());
        den = den.max(y.abs());
    }
    num / den.max(f64::MIN_POSITIVE)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::new(0)?;
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    // --no-bulk leaves out the copy-engine variants (to time the rest if one of them hangs).
    let no_bulk = std::env::args().any(|a| a == "--no-bulk");
    // --shape i: only the i-th shape; --variant NAME: only that variant, at mqa_tc_splits'
    // split count (for a profiler run).
    let arg = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let only_shape: Option<usize> = arg("--shape").and_then(|s| s.parse().ok());
    let only_variant = arg("--variant");
    // --ablate: time mla_decode_w64 and its ablations (a stage left out; not checked, their
    // outputs are not attention) at mqa_tc_splits' count, to place the time of a tile.
    let ablate = std::env::args().any(|a| a == "--ablate");
    let wanted = |v: MlaVariant| {
        v.runs_on(gpu.arch)
            && !(no_bulk && matches!(v, MlaVariant::M1S3B | MlaVariant::M2KB))
            && only_variant.as_ref().is_none_or(|n| *n == format!("{v:?}"))
    };
    let (l, r, p, bs) = (512usize, 64usize, 128usize, 64usize);
    let mut kernels = Vec::new();
    for v in MlaVariant::ALL {
        if !wanted(v) {
            continue;
        }
        let f = gpu.func(v.kernel())?;
        let regs = f.num_regs()?;
        let local = f.get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?;
        println!(
            "{v:?}: {} heads/block, {regs} registers, {local} B local, {} B shared",
            v.heads_per_block(),
            v.smem_bytes()
        );
        kernels.push(serde_json::json!({"variant": format!("{v:?}"), "kernel": v.kernel(), "registers": regs, "local_bytes": local, "shared_bytes": v.smem_bytes()}));
    }
    let mut rows = Vec::new();
    let mut table = Vec::new();
    let shapes = [
        (64usize, 16usize, 4096usize),
        (128, 16, 8192),
        (64, 32, 4096),
        (64, 64, 4096),
        (64, 128, 4096),
        (128, 128, 4096),
        // Short splits: GLM-5-shaped decode of 16 sequences at 1,024 keys (1-16 tiles a
        // split), and one sequence at 8,192.
        (16, 64, 1024),
        (1, 64, 8192),
        // Small decode steps of a 16-head model (V2-Lite): latency-bound, 1-4 tokens.
        (1, 16, 64),
        (1, 16, 512),
        (1, 16, 2048),
        (1, 16, 8192),
        (4, 16, 512),
        (4, 16, 4096),
    ];
    for (si, &(b, heads, ctx)) in shapes.iter().enumerate() {
        if only_shape.is_some_and(|i| i != si) {
            continue;
        }
        let blocks_per = ctx.div_ceil(bs);
        let nb = b * blocks_per;
        let seed = (b * 1_000_003 + heads * 1009 + ctx) as u64;
        let cache = gpu.upload(&random_bf16(nb * bs * (l + r), seed))?;
        // Pages in a shuffled order, as a long-running server's free list leaves them.
        let mut tables: Vec<i32> = (0..nb as i32).collect();
        let mut s = seed | 1;
        for i in (1..tables.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            tables.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let bt = gpu.upload(&tables)?;
        let bt_off = gpu.upload(&(0..b).map(|i| (i * blocks_per) as i32).collect::<Vec<_>>())?;
        let n_keys = gpu.upload(&vec![ctx as i32; b])?;
        let sel_off = gpu.upload(&vec![-1i32; b])?;
        let sel_pos = gpu.upload(&[0i32])?;
        let q_lat = gpu.upload(&random_f32(b * heads * l, seed + 1))?;
        let q = gpu.upload(&random_f32(b * heads * (p + r), seed + 2))?;
        let dims = AttnDims {
            t: b,
            heads,
            p,
            r,
            v: 0,
            l,
            scale: (p as f32 + r as f32).powf(-0.5),
        };
        let keys = KeyLists {
            n_keys: n_keys.ptr(),
            sel_off: sel_off.ptr(),
            sel_pos: sel_pos.ptr(),
        };
        let bytes = (b * ctx * (l + r) * 2 + b * heads * (l + r) * 4 + b * heads * l * 2) as f64;
        let flops = (2 * b * heads * ctx * (l + r) + 2 * b * heads * ctx * l) as f64;
        let max_splits = 16usize;
        let part: DBuf<f32> = gpu.alloc(b * heads * max_splits * l)?;
        let lse: DBuf<f32> = gpu.alloc(b * heads * max_splits)?;
        let reference: DBuf<u16> = gpu.alloc_filled(b * heads * l, 0xff)?;
        let o_lat: DBuf<u16> = gpu.alloc(b * heads * l)?;
        gpu.attn_mqa(
            &dims,
            q_lat.ptr(),
            q.ptr(),
            cache.ptr(),
            &keys,
            bt.ptr(),
            bt_off.ptr(),
            bs,
            4,
            part.ptr(),
            lse.ptr(),
            reference.ptr(),
        )?;
        let want = gpu.to_host(&reference)?;
        let heuristic = gpu.mqa_tc_splits(b, heads, ctx, max_splits)?;
        if ablate && heads >= 64 && MlaVariant::W64.runs_on(gpu.arch) {
            for name in std::iter::once(MlaVariant::W64.kernel()).chain(W64_ABLATIONS) {
                let run = || {
                    gpu.attn_mqa_tc_kernel(
                        MlaVariant::W64,
                        name,
                        &dims,
                        q_lat.ptr(),
                        q.ptr(),
                        cache.ptr(),
                        &keys,
                        bt.ptr(),
                        bt_off.ptr(),
                        bs,
                        heuristic,
                        part.ptr(),
                        lse.ptr(),
                        o_lat.ptr(),
                        Early::No,
                    )
                };
                let us = time_us(&gpu, &|_| run(), 3, 7, 10)?;
                let tiles = ctx.div_ceil(heuristic).div_ceil(64);
                println!("ablation B{b} H{heads} ctx{ctx} splits {heuristic} {name:<24} {us:8.1} µs ({:.2} µs per tile)", us / tiles as f64);
                rows.push(serde_json::json!({"batch": b, "heads": heads, "ctx": ctx, "kernel": name, "splits": heuristic, "us_median": us, "ablation": true}));
            }
        }
        let mut best: Vec<(String, f64, usize)> = Vec::new();
        let mut failed = Vec::new();
        let mut record = |kernel: String, splits: usize, us: f64, err: Option<f64>| {
            let gbs = bytes / us / 1e3;
            let tfs = flops / us / 1e6;
            println!("B{b} H{heads} ctx{ctx} {kernel:<8} splits {splits:>2}: {us:8.1} µs {gbs:6.0} GB/s {tfs:6.1} TFLOP/s");
            rows.push(serde_json::json!({"batch": b, "heads": heads, "ctx": ctx, "kernel": kernel, "splits": splits, "us_median": us, "gb_s": gbs, "tflop_s": tfs, "rel_err_vs_cuda_core": err}));
            match best.iter_mut().find(|e| e.0 == kernel) {
                Some(e) if e.1 <= us => {}
                Some(e) => *e = (kernel, us, splits),
                None => best.push((kernel, us, splits)),
            }
        };
        // The executor's split count for the CUDA-core kernel (keys / 256, at most 16).
        let splits = ctx.div_ceil(256).clamp(1, 16);
        let run = || {
            gpu.attn_mqa(
                &dims,
                q_lat.ptr(),
                q.ptr(),
                cache.ptr(),
                &keys,
                bt.ptr(),
                bt_off.ptr(),
                bs,
                splits,
                part.ptr(),
                lse.ptr(),
                o_lat.ptr(),
            )
        };
        record(
            "naive".into(),
            splits,
            time_us(&gpu, &|_| run(), 3, 3, 3)?,
            None,
        );
        for v in MlaVariant::ALL {
            if !wanted(v) {
                continue;
            }
            let mut sweep = vec![1usize, 2, 4, 8, 16];
            if !sweep.contains(&heuristic) {
                sweep.push(heuristic);
            }
            if only_variant.is_some() {
                sweep = vec![heuristic];
            }
            for splits in sweep {
                let run = || {
                    gpu.attn_mqa_tc_kernel(
                        v,
                        v.kernel(),
                        &dims,
                        q_lat.ptr(),
                        q.ptr(),
                        cache.ptr(),
                        &keys,
                        bt.ptr(),
                        bt_off.ptr(),
                        bs,
                        splits,
                        part.ptr(),
                        lse.ptr(),
                        o_lat.ptr(),
                        Early::No,
                    )
                };
                gpu.write(&o_lat, 0, &vec![0xffffu16; b * heads * l])?;
                run()?;
                let err = rel_err(&gpu.to_host(&o_lat)?, &want);
                // Both outputs are rounded to bf16: one ulp apart is up to 2^-7 of the max.
                if err.is_nan() || err > 1.0 / 128.0 {
                    println!("B{b} H{heads} ctx{ctx} {v:?} splits {splits}: differs from the CUDA-core kernel by {err:.3e}; not timed");
                    failed.push(serde_json::json!({"batch": b, "heads": heads, "ctx": ctx, "kernel": format!("{v:?}"), "splits": splits, "rel_err_vs_cuda_core": err, "failed": true}));
                    continue;
                }
                // A race shows as a result that moves between runs on the same inputs.
                let first = gpu.to_host(&o_lat)?;
                run()?;
                if gpu.to_host(&o_lat)? != first {
                    println!(
                        "B{b} H{heads} ctx{ctx} {v:?} splits {splits}: two runs differ (a race?)"
                    );
                    failed.push(serde_json::json!({"batch": b, "heads": heads, "ctx": ctx, "kernel": format!("{v:?}"), "splits": splits, "nondeterministic": true}));
                }
                record(
                    format!("{v:?}"),
                    splits,
                    time_us(&gpu, &|_| run(), 3, 7, 10)?,
                    Some(err),
                );
            }
        }
        rows.extend(failed);
        for (kernel, us, splits) in best {
            table.push(format!(
                "| {b} | {heads} | {ctx} | {kernel} | {splits}{} | {us:.1} | {:.0} | {:.0}% | {:.1} | {:.1}% |",
                if kernel != "naive" && splits == heuristic { " (h)" } else { "" },
                bytes / us / 1e3,
                100.0 * bytes / us / 1e3 / COPY_GBS,
                flops / us / 1e6,
                100.0 * flops / us / 1e6 / GEMM_TFS
            ));
        }
    }
    println!();
    println!("best split per kernel ((h) = mqa_tc_splits' choice)");
    println!(
        "| B | heads | ctx | kernel | splits | µs (median) | GB/s | % copy | TFLOP/s | % GEMM |"
    );
    println!("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for line in &table {
        println!("{line}");
    }
    if let Some(p) = json {
        let doc = serde_json::json!({"gpu": gpu.name, "arch": gpu.arch, "bytes": "cache rows + q (f32, 576 per head) + o_lat (bf16)", "flops": "2*B*H*ctx*(576+512)", "kernels": kernels, "rows": rows});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
