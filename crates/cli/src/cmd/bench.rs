//! `mlaserve bench`: llama-bench style prompt processing (pp) and generation (tg) tokens/s.
//!
//! pp: one batch of `p` prompt tokens into an empty cache. tg: `n` single-token decode steps
//! after a 1-token context, each handing back what greedy generation reads — every row's
//! argmax ([`Executor::forward_picks`]; `--tg-logits sample`: a token drawn at temperature
//! 1 where the logits are, `sample-filtered` with top-k 50 and top-p 0.95; `full`: the whole
//! logits rows, as a sampler with penalties or logprobs reads them). Each repeated `reps` times; reported as median and
//! spread.

use anyhow::Result;
use mlaserve_model::{
    AttentionPath, Executor, Filter, ForwardBatch, LogitsWanted, RowDraw, SeqInput,
};

/// What each tg step hands back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TgLogits {
    /// Each row's argmax, reduced where the logits are (greedy generation).
    Argmax,
    /// Each row's token drawn at temperature 1 where the logits are (OpenAI's default).
    Sample,
    /// Each row's token drawn at temperature 1 with top-k 50 and top-p 0.95 where the logits
    /// are.
    SampleFiltered,
    /// The whole `[rows, vocab]` logits (sampling with top-p, top-k, penalties, logprobs).
    Full,
}
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

/// One measured run: tokens/s and the share of the wall time spent in all-reduce.
struct Run {
    tok_s: f64,
    /// None: the executor does not time its collectives.
    comm_share: Option<f64>,
}

fn pp(exec: &mut dyn Executor, p: usize, rep: u64) -> Result<Run> {
    let blocks = p.div_ceil(BS);
    exec.init_cache(blocks, BS)?;
    let seq = SeqInput {
        tokens: tokens(p, exec.config().vocab_size, rep),
        context_len: 0,
        block_table: (0..blocks as u32).collect(),
        logits: LogitsWanted::Last,
    };
    let batch = ForwardBatch::new(vec![seq], BS, AttentionPath::Auto)?;
    exec.take_comm_seconds();
    let t0 = Instant::now();
    exec.forward(&batch)?;
    let wall = t0.elapsed().as_secs_f64();
    Ok(Run {
        tok_s: p as f64 / wall,
        comm_share: exec.take_comm_seconds().map(|c| c / wall),
    })
}

/// `n` decode steps of `b` sequences at once (after a 1-token context each).
fn tg(exec: &mut dyn Executor, n: usize, b: usize, rep: u64, out: TgLogits) -> Result<Run> {
    let per = (n + 1).div_ceil(BS);
    exec.init_cache(per * b, BS)?;
    let vocab = exec.config().vocab_size;
    let toks: Vec<Vec<u32>> = (0..b)
        .map(|s| tokens(n + 1, vocab, rep * 7919 + s as u64 + 1000))
        .collect();
    // one output buffer for all steps, as the engine keeps one
    let (mut logits, mut picks, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    let mut draws = vec![RowDraw::Argmax; b];
    let mut step = |i: usize, exec: &mut dyn Executor| -> Result<()> {
        let seqs = (0..b)
            .map(|s| SeqInput {
                tokens: vec![toks[s][i]],
                context_len: i,
                block_table: (0..per as u32).map(|k| (s * per) as u32 + k).collect(),
                logits: LogitsWanted::Last,
            })
            .collect();
        let batch = ForwardBatch::new(seqs, BS, AttentionPath::Auto)?;
        match out {
            TgLogits::Argmax => exec.forward_picks(&batch, &draws, &mut picks, &mut whole)?,
            TgLogits::Sample | TgLogits::SampleFiltered => {
                let filter = match out {
                    TgLogits::SampleFiltered => Filter {
                        top_k: 50,
                        top_p: 0.95,
                        min_p: 0.0,
                    },
                    _ => Filter::NONE,
                };
                for (s, d) in draws.iter_mut().enumerate() {
                    *d = RowDraw::Softmax {
                        inv_temperature: 1.0,
                        random: ((i * b + s) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        filter,
                    };
                }
                exec.forward_picks(&batch, &draws, &mut picks, &mut whole)?
            }
            TgLogits::Full => exec.forward_into(&batch, &mut logits)?,
        }
        Ok(())
    };
    step(0, exec)?;
    exec.take_comm_seconds();
    let t0 = Instant::now();
    for i in 1..=n {
        step(i, exec)?;
    }
    let wall = t0.elapsed().as_secs_f64();
    Ok(Run {
        tok_s: (n * b) as f64 / wall,
        comm_share: exec.take_comm_seconds().map(|c| c / wall),
    })
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

#[allow(clippy::too_many_arguments)]
pub fn run(
    exec: &mut dyn Executor,
    name: &str,
    p: usize,
    n: usize,
    batches: &[usize],
    reps: usize,
    tg_logits: TgLogits,
    json: bool,
) -> Result<()> {
    let threads = rayon::current_num_threads();
    let device = exec.device();
    // (test, (median tok/s, half-range), median all-reduce share)
    let mut rows = Vec::new();
    let collect = |runs: Vec<Run>| {
        let shares: Option<Vec<f64>> = runs.iter().map(|r| r.comm_share).collect();
        let share = shares.map(|v| summary(v).0);
        (summary(runs.iter().map(|r| r.tok_s).collect()), share)
    };
    if p > 0 {
        pp(exec, p.min(16), 0)?; // warm-up
        let runs = (0..reps)
            .map(|r| pp(exec, p, r as u64))
            .collect::<Result<Vec<_>>>()?;
        let (t, share) = collect(runs);
        rows.push((format!("pp{p}"), t, share));
    }
    if n > 0 {
        for &b in batches {
            let runs = (0..reps)
                .map(|r| tg(exec, n, b, r as u64, tg_logits))
                .collect::<Result<Vec<_>>>()?;
            let (t, share) = collect(runs);
            let mut name = if b == 1 {
                format!("tg{n}")
            } else {
                format!("tg{n} b{b}")
            };
            match tg_logits {
                TgLogits::Argmax => {}
                TgLogits::Sample => name.push_str(" sampled"),
                TgLogits::SampleFiltered => name.push_str(" sampled top-k/top-p"),
                TgLogits::Full => name.push_str(" full logits"),
            }
            rows.push((name, t, share));
        }
    }
    if json {
        let tests: Vec<serde_json::Value> = rows
            .iter()
            .map(|(t, (m, s), c)| serde_json::json!({"test": t, "tokens_per_s_median": m, "spread": s, "allreduce_share": c, "reps": reps}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"model": name, "device": device, "threads": threads, "results": tests})
            )?
        );
    } else {
        println!("| model | device | threads | test | t/s (median ± half-range, {reps} reps) | all-reduce share |");
        println!("| --- | --- | ---: | ---: | ---: | ---: |");
        for (t, (m, s), c) in rows {
            let c = c.map_or("-".to_string(), |c| format!("{:.1}%", c * 100.0));
            println!("| {name} | {device} | {threads} | {t} | {m:.2} ± {s:.2} | {c} |");
        }
    }
    Ok(())
}
