//! `mlaserve bench`: llama-bench style prompt processing (pp) and generation (tg) tokens/s.
//!
//! pp: one batch of `p` prompt tokens into an empty cache. tg: `n` single-token decode steps
//! after a 1-token context. Each repeated `reps` times; reported as median and spread.

use anyhow::Result;
use mlaserve_model::{AttentionPath, Executor, ForwardBatch, LogitsWanted, SeqInput};
use std::time::Instant;

const BS: usize = 64;

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn pp(exec: &mut dyn Executor, p: usize, rep: u64) -> Result<f64> {
    let blocks = p.div_ceil(BS);
    exec.init_cache(blocks, BS)?;
    let seq = SeqInput {
        tokens: tokens(p, exec.config().vocab_size, rep),
        context_len: 0,
        block_table: (0..blocks as u32).collect(),
        logits: LogitsWanted::Last,
    };
    let batch = ForwardBatch::new(vec![seq], BS, AttentionPath::Auto)?;
    let t0 = Instant::now();
    exec.forward(&batch)?;
    Ok(p as f64 / t0.elapsed().as_secs_f64())
}

fn tg(exec: &mut dyn Executor, n: usize, rep: u64) -> Result<f64> {
    let blocks = (n + 1).div_ceil(BS);
    exec.init_cache(blocks, BS)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let toks = tokens(n + 1, exec.config().vocab_size, rep + 1000);
    let step = |i: usize, exec: &mut dyn Executor| -> Result<()> {
        let seq = SeqInput {
            tokens: vec![toks[i]],
            context_len: i,
            block_table: table.clone(),
            logits: LogitsWanted::Last,
        };
        exec.forward(&ForwardBatch::new(vec![seq], BS, AttentionPath::Auto)?)?;
        Ok(())
    };
    step(0, exec)?;
    let t0 = Instant::now();
    for i in 1..=n {
        step(i, exec)?;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// Median and (max-min)/2 of a sample.
fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let med = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (med, (v[v.len() - 1] - v[0]) / 2.0)
}

pub fn run(
    exec: &mut dyn Executor,
    name: &str,
    p: usize,
    n: usize,
    reps: usize,
    json: bool,
) -> Result<()> {
    let threads = rayon::current_num_threads();
    let device = exec.device();
    let mut rows = Vec::new();
    if p > 0 {
        pp(exec, p.min(16), 0)?; // warm-up
        let v: Vec<f64> = (0..reps)
            .map(|r| pp(exec, p, r as u64))
            .collect::<Result<_>>()?;
        rows.push((format!("pp{p}"), summary(v)));
    }
    if n > 0 {
        let v: Vec<f64> = (0..reps)
            .map(|r| tg(exec, n, r as u64))
            .collect::<Result<_>>()?;
        rows.push((format!("tg{n}"), summary(v)));
    }
    if json {
        let tests: Vec<serde_json::Value> = rows
            .iter()
            .map(|(t, (m, s))| serde_json::json!({"test": t, "tokens_per_s_median": m, "spread": s, "reps": reps}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"model": name, "device": device, "threads": threads, "results": tests})
            )?
        );
    } else {
        println!("| model | device | threads | test | t/s (median ± half-range, {reps} reps) |");
        println!("| --- | --- | ---: | ---: | ---: |");
        for (t, (m, s)) in rows {
            println!("| {name} | {device} | {threads} | {t} | {m:.2} ± {s:.2} |");
        }
    }
    Ok(())
}
