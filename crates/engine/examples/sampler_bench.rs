//! The sampler's host time a token, the part of a decode step that runs on the CPU after the
//! logits arrive (on the GPU it is on every token's critical path): `sample` over one row of
//! `vocab` logits, greedy and top-p, median of `iters` calls; then a step's 64 rows one after
//! another and across rayon's pool (as the engine samples a step of 4+ rows).
//!
//!   cargo run --release -p mlaserve-engine --example sampler_bench -- [vocab] [iters]
use mlaserve_engine::rng::Rng;
use mlaserve_engine::sampler::sample;
use mlaserve_engine::SamplingParams;
use std::time::Instant;

fn median_us(mut f: impl FnMut(), iters: usize) -> f64 {
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let vocab: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(102_400);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let mut rng = Rng::seed_from_u64(7);
    let uniform: Vec<f32> = (0..vocab)
        .map(|_| (rng.next_f64() as f32 - 0.5) * 20.0)
        .collect();
    // A random permutation of the ranks 1..=vocab over the ids.
    let mut ranks: Vec<usize> = (1..=vocab).collect();
    for i in (1..vocab).rev() {
        ranks.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let zipf: Vec<f32> = ranks.iter().map(|&r| -1.1 * (r as f32).ln()).collect();
    let prompt: Vec<u32> = (0..512).map(|i| (i * 37 % vocab) as u32).collect();
    let output: Vec<u32> = (0..64).map(|i| (i * 101 % vocab) as u32).collect();
    let cases = [
        ("greedy", SamplingParams::greedy(16)),
        (
            "greedy, repetition penalty 1.1",
            SamplingParams {
                repetition_penalty: 1.1,
                ..SamplingParams::greedy(16)
            },
        ),
        (
            "temperature 0.8",
            SamplingParams {
                temperature: 0.8,
                ..SamplingParams::greedy(16)
            },
        ),
        (
            "temperature 0.8, top-k 50",
            SamplingParams {
                temperature: 0.8,
                top_k: Some(50),
                ..SamplingParams::greedy(16)
            },
        ),
        (
            "temperature 0.8, top-p 0.95",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                ..SamplingParams::greedy(16)
            },
        ),
    ];
    println!("sample() over {vocab} logits, median of {iters} calls, µs:");
    println!("  {:<32} {:>8} {:>8}", "", "uniform", "Zipf");
    for (name, p) in cases {
        let mut us = [0.0; 2];
        for (u, logits) in us.iter_mut().zip([&uniform, &zipf]) {
            let mut r = Rng::seed_from_u64(1);
            *u = median_us(
                || {
                    std::hint::black_box(
                        sample(logits, vocab, &p, &prompt, &output, &mut r).unwrap(),
                    );
                },
                iters,
            );
        }
        println!("  {name:<32} {:8.1} {:8.1}", us[0], us[1]);
    }
    use rayon::prelude::*;
    let rows = 64;
    let step: Vec<f32> = (0..rows).flat_map(|_| zipf.iter().copied()).collect();
    println!(
        "a step of {rows} Zipf rows, median of {} steps, µs: one thread / {} rayon threads",
        iters / 10,
        rayon::current_num_threads()
    );
    for (name, p) in [
        ("greedy", SamplingParams::greedy(16)),
        (
            "temperature 0.8",
            SamplingParams {
                temperature: 0.8,
                ..SamplingParams::greedy(16)
            },
        ),
    ] {
        let one = |i: usize| {
            let mut r = Rng::seed_from_u64(i as u64);
            let row = &step[i * vocab..(i + 1) * vocab];
            sample(row, vocab, &p, &prompt, &output, &mut r).unwrap()
        };
        let seq = median_us(
            || {
                std::hint::black_box((0..rows).map(one).collect::<Vec<_>>());
            },
            iters / 10,
        );
        let par = median_us(
            || {
                std::hint::black_box((0..rows).into_par_iter().map(one).collect::<Vec<_>>());
            },
            iters / 10,
        );
        println!("  {name:<32} {seq:8.0} {par:8.0}");
    }
}
