//! Where a decode step's time goes: loads a model on the GPU, prefills `--batch` sequences of
//! `--ctx` random tokens, then times one decode step kernel by kernel
//! ([`CudaExecutor::profile_step`]: captured as a CUDA graph with an event after every kernel
//! and GEMM, replayed, read back). Prints each label (kernel name, or GEMM m×n×k) with its
//! calls, total µs and share of the step, and for GEMMs the bandwidth of the bytes they must
//! move (bf16 weights and inputs, f32 outputs) against the 3,970 GB/s copy ceiling.
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example decode_profile -- MODEL.gguf
//!     [--batch 1] [--ctx 512] [--prefill N] [--json out.json] [--replays N] [--forward N]
//! ```
//!
//! `--prefill N` profiles a step of N new tokens a sequence instead (a prompt chunk after
//! `--ctx` cached tokens; `--ctx 0`: whole prompts), after its whole-step time.
//!
//! `--forward N` first times N whole steps as the engine runs them (`forward_into`: host
//! inputs, the graph, the logits to the host), with fresh logits, with one kept buffer, and
//! reduced to each row's argmax on the device (`forward_picks`, greedy steps), and
//! the logits' copy alone four ways (`Gpu::lab_host_reads`); against `--replays`, the host's
//! part of a step.
//!
//! `--replays N` instead times N replays of the step's graph with no event between its
//! kernels (they overlap as in serving) and prints the median, p10 and p90 µs a step: with
//! `MLASERVE_LAB_TWICE=kernel` (each launch of that kernel made twice) the difference from
//! a plain run is that kernel's marginal cost in the pipelined step.

use mlaserve_cuda::CudaExecutor;
use mlaserve_model::{
    AttentionPath, Executor, ForwardBatch, LoadOptions, LogitsWanted, Model, SeqInput,
};
use std::sync::Arc;

const COPY_GBS: f64 = 3970.0;

/// Bytes a GEMM labelled "gemm MxNxK[ xB]" must move: bf16 weights and inputs, f32 out.
fn gemm_bytes(label: &str) -> Option<f64> {
    let [m, n, k, batch] = gemm_dims(label)?;
    Some(batch * (n * k * 2.0 + m * k * 2.0 + m * n * 4.0))
}

/// A cuBLAS GEMM's floating-point operations, from its label.
fn gemm_flops(label: &str) -> Option<f64> {
    let [m, n, k, batch] = gemm_dims(label)?;
    Some(2.0 * batch * m * n * k)
}

/// [m, n, k, batch] of a "gemm MxNxK[ xB]" label.
fn gemm_dims(label: &str) -> Option<[f64; 4]> {
    let rest = label.strip_prefix("gemm ")?;
    let (dims, batch) = match rest.split_once(" x") {
        Some((d, b)) => (d, b.parse::<f64>().ok()?),
        None => (rest, 1.0),
    };
    let v: Vec<f64> = dims.split('x').filter_map(|x| x.parse().ok()).collect();
    let [m, n, k] = v[..] else { return None };
    Some([m, n, k, batch])
}

/// The phase trace of the last traced launch (`MLASERVE_KERNEL_TRACE=1`: common.cuh's
/// MLA_T points): per point, the median and max over blocks of the clocks since the point
/// before, and the spread of the blocks' start and their durations in ns.
fn print_trace(tr: &[i64]) {
    use mlaserve_cuda::kernels::{TRACE_BLOCKS, TRACE_WORDS};
    let (stamps, sms) = tr.split_at(TRACE_BLOCKS * TRACE_WORDS);
    let blocks: Vec<&[i64]> = stamps.chunks(TRACE_WORDS).filter(|b| b[14] != 0).collect();
    // the SMs of the traced blocks: how many blocks shared one
    let mut per_sm = std::collections::BTreeMap::<i64, usize>::new();
    for (b, &sm) in stamps.chunks(TRACE_WORDS).zip(sms) {
        if b[14] != 0 {
            *per_sm.entry(sm).or_default() += 1;
        }
    }
    let mut shares = std::collections::BTreeMap::<usize, usize>::new();
    for &n in per_sm.values() {
        *shares.entry(n).or_default() += 1;
    }
    if blocks.is_empty() {
        println!("trace: no traced kernel ran");
        return;
    }
    let stats = |mut v: Vec<i64>| {
        v.sort();
        (v[v.len() / 2], v[v.len() - 1])
    };
    let g0 = blocks.iter().map(|b| b[14]).min().unwrap_or(0);
    println!(
        "trace of {} blocks (clocks since the point before: median / max)",
        blocks.len()
    );
    for i in 1..14 {
        let (m, x) = stats(blocks.iter().map(|b| b[i] - b[i - 1]).collect());
        println!("  point {i:2}: {m:6} / {x:6}");
    }
    let (m, x) = stats(blocks.iter().map(|b| b[14] - g0).collect());
    println!("  start after the first block's, ns: {m} / {x}");
    let (m, x) = stats(blocks.iter().map(|b| b[15] - b[14]).collect());
    println!("  start to end, ns: {m} / {x}");
    let shares: Vec<String> = shares
        .iter()
        .map(|(n, sms)| format!("{sms} SMs with {n}"))
        .collect();
    println!("  blocks on {} SMs: {}", per_sm.len(), shares.join(", "));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: decode_profile MODEL [--batch B] [--ctx C]")?;
    let arg = |name: &str| args.iter().skip_while(|a| *a != name).nth(1).cloned();
    let batch: usize = arg("--batch").map_or(Ok(1), |v| v.parse())?;
    let ctx: usize = arg("--ctx").map_or(Ok(512), |v| v.parse())?;
    // --prefill N: the profiled step gives each sequence N new tokens (a prompt chunk after
    // --ctx cached ones, or a whole prompt at --ctx 0) instead of one.
    let new: usize = arg("--prefill").map_or(Ok(1), |v| v.parse())?;
    let model = Arc::new(Model::load(
        std::path::Path::new(path),
        &LoadOptions::default(),
    )?);
    let vocab = model.config().vocab_size as u32;
    let mut exec = CudaExecutor::new(model, 0)?;
    let bs = 16;
    let per = (ctx + new + 1).div_ceil(bs);
    exec.init_cache(per * batch, bs)?;
    let table = |i: usize| ((i * per) as u32..((i + 1) * per) as u32).collect::<Vec<u32>>();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut tok = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % vocab as u64) as u32
    };
    // Prefill one sequence at a time (the prompt is not what is measured).
    for i in (0..batch).filter(|_| ctx > 0) {
        let seq = SeqInput {
            tokens: (0..ctx).map(|_| tok()).collect(),
            context_len: 0,
            block_table: table(i),
            logits: LogitsWanted::Last,
        };
        exec.forward(&ForwardBatch::new(vec![seq], bs, AttentionPath::Auto)?)?;
    }
    let seqs = (0..batch)
        .map(|i| SeqInput {
            tokens: (0..new).map(|_| tok()).collect(),
            context_len: ctx,
            block_table: table(i),
            logits: LogitsWanted::Last,
        })
        .collect();
    let step = ForwardBatch::new(seqs, bs, AttentionPath::Auto)?;
    exec.forward(&step)?; // a warm-up of the same shape
    if new > 1 {
        // the whole step as the engine runs it, for the profile's event overhead
        let mut t: Vec<f64> = (0..5)
            .map(|_| {
                let t0 = std::time::Instant::now();
                exec.forward(&step)
                    .map(|_| t0.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_, _>>()?;
        t.sort_by(|a, b| a.total_cmp(b));
        println!(
            "prefill step of {batch} x {new} tokens at context {ctx}: median {:.2} ms ({:.0} tok/s)",
            t[2],
            (batch * new) as f64 / t[2] * 1e3
        );
    }
    if let Some(n) = arg("--forward") {
        // The whole step as the engine runs it (host inputs, graph replay, the logits to the
        // host) against --replays (the GPU's part): fresh logits each step, or one buffer.
        let n: usize = n.parse()?;
        let median = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let mut fresh = Vec::with_capacity(n);
        let mut kept = Vec::with_capacity(n);
        let mut reduced = Vec::with_capacity(n);
        let (mut buf, mut rows, mut none) = (Vec::new(), Vec::new(), Vec::new());
        let greedy = vec![mlaserve_model::RowDraw::Argmax; batch];
        for _ in 0..n {
            let t0 = std::time::Instant::now();
            exec.forward_picks(&step, &greedy, &mut rows, &mut none)?;
            reduced.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = std::time::Instant::now();
            drop(exec.forward(&step)?);
            fresh.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = std::time::Instant::now();
            exec.forward_into(&step, &mut buf)?;
            kept.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        println!(
            "forward batch {batch} ctx {ctx}: median {:.1} µs a step with fresh logits, {:.1} with one buffer ({} f32 of logits), {:.1} reduced to argmaxes on the device",
            median(fresh),
            median(kept),
            buf.len(),
            median(reduced)
        );
        // The logits' copy alone, four ways (Gpu::lab_host_reads), from a device buffer.
        let len = batch * vocab as usize;
        let d = exec.gpu().alloc::<f32>(len)?;
        let [f, k, p, pk] = exec.gpu().lab_host_reads(d.ptr(), len, n)?;
        println!(
            "{:.1} MB of logits to the host: into fresh memory {f:.2} ms, kept memory {k:.2}, page-locked {p:.2}, page-locked then into kept memory {pk:.2}",
            len as f64 * 4e-6
        );
    }
    if let Some(n) = arg("--replays") {
        let traced = mlaserve_cuda::kernels::trace_define().is_some();
        if traced {
            exec.gpu().kernel_trace()?; // clears the prefill's and warm-up's stamps
        }
        let mut t = exec.time_step(&step, n.parse()?)?;
        t.sort_by(|a, b| a.total_cmp(b));
        let q = |f: f64| t[((t.len() - 1) as f64 * f).round() as usize];
        let twice = std::env::var("MLASERVE_LAB_TWICE").unwrap_or_default();
        println!(
            "replays {} batch {batch} ctx {ctx} twice [{twice}]: median {:.1} µs (p10 {:.1}, p90 {:.1}), {:.1} tok/s",
            t.len(),
            q(0.5),
            q(0.1),
            q(0.9),
            batch as f64 / q(0.5) * 1e6
        );
        if traced {
            print_trace(&exec.gpu().kernel_trace()?);
        }
        return Ok(());
    }
    let (prof, graphed) = exec.profile_step(&step)?;
    let total: f64 = prof.iter().map(|p| p.1).sum();
    // Aggregate by label, in order of first appearance.
    let mut rows: Vec<(String, usize, f64)> = Vec::new();
    for (label, us) in &prof {
        match rows.iter_mut().find(|r| &r.0 == label) {
            Some(r) => {
                r.1 += 1;
                r.2 += us;
            }
            None => rows.push((label.clone(), 1, *us)),
        }
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    println!(
        "{}: step of {batch} x {new} token(s) at context {ctx}, {}: {:.1} µs ({:.0} tok/s), {} kernels",
        exec.device(),
        if graphed { "CUDA graph" } else { "eager" },
        total,
        (batch * new) as f64 / total * 1e6,
        prof.len()
    );
    println!("| label | calls | µs | share | µs/call | GB/s | TFLOP/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut json_rows = Vec::new();
    for (label, calls, us) in &rows {
        let gbs = gemm_bytes(label).map(|b| b * *calls as f64 / us / 1e3);
        let tflops = gemm_flops(label).map_or(String::new(), |f| {
            format!("{:.0}", f * *calls as f64 / us / 1e6)
        });
        println!(
            "| {label} | {calls} | {us:.1} | {:.1}% | {:.2} | {} | {tflops} |",
            100.0 * us / total,
            us / *calls as f64,
            gbs.map_or(String::new(), |g| format!(
                "{g:.0} ({:.0}%)",
                100.0 * g / COPY_GBS
            ))
        );
        json_rows.push(serde_json::json!({"label": label, "calls": calls, "us": us, "gb_s": gbs}));
    }
    if let Some(p) = arg("--json") {
        let doc = serde_json::json!({"device": exec.device(), "batch": batch, "ctx": ctx, "graphed": graphed, "step_us": total, "kernels": prof.len(), "rows": json_rows});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
