//! Matmul throughput:
//! `cargo run --release -p mlaserve-backend --example matmul_bench [reps] [cols] [types]`.
//!
//! For each weight type (default Q8_0,Q4_K,Q6_K,F32,BF16,F16), `[n_tokens x cols] ·
//! [4096 x cols]ᵀ` (cols default 4096; llama.cpp's `test-backend-ops perf` uses 14336) at
//! n_tokens 1 and 512.
//! GEMV (n_tokens = 1) is timed two ways: "hot" re-reads one matrix (it stays in the last
//! level cache), "cold" walks a ring of copies larger than the cache, as a model's decode
//! step does. Prints the median and min/max over `reps` runs: GB/s of weight bytes read and
//! GFLOP/s (2·n_tokens·rows·cols per run).
//!
//! On a shared, loaded machine wall time says little; with `RAYON_NUM_THREADS=1` the work runs
//! on the main thread and the rates are computed from its CPU time
//! (`/proc/thread-self/schedstat`) instead, i.e. per core (unless `BENCH_WALL` is set).

use mlaserve_backend::{matmul, Bytes, GgmlType, Isa, QMatrix};
use std::time::Instant;

const ROWS: usize = 4096;
/// Bytes of weight copies the cold GEMV walks through (well past a 300 MiB L3).
const COLD_BYTES: usize = 1 << 30;

fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Nanoseconds this thread has run on a CPU (Linux), if readable.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    let cols: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let types: Vec<GgmlType> = args
        .get(3)
        .map(|s| {
            s.split(',')
                .map(|n| GgmlType::from_name(n).expect("unknown type name"))
                .collect()
        })
        .unwrap_or_else(|| {
            use GgmlType::*;
            vec![Q8_0, Q4_K, Q6_K, F32, BF16, F16]
        });
    let cpu_clock = rayon::current_num_threads() == 1
        && thread_cpu_ns().is_some()
        && std::env::var_os("BENCH_WALL").is_none();
    println!(
        "isa {:?}, threads {}, reps {reps}, clock: {}",
        Isa::detect(),
        rayon::current_num_threads(),
        if cpu_clock {
            "thread CPU time (per core)"
        } else {
            "wall"
        }
    );
    let mut seed = 0x1234_5678u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let wf: Vec<f32> = (0..ROWS * cols).map(|_| rand()).collect();
    let x: Vec<f32> = (0..512 * cols).map(|_| rand()).collect();
    println!(
        "{:<6} {:>9} {:>6} {:>12} {:>10} {:>10}  (min..max ms)",
        "type", "shape", "cache", "ms (median)", "GB/s", "GFLOP/s"
    );
    for ty in types {
        let w = QMatrix::quantize_from_f32(ty, ROWS, cols, &wf).expect("quantize");
        let bytes = w.data().len();
        let n_copies = (COLD_BYTES / bytes).max(2);
        let ring: Vec<QMatrix> = (0..n_copies)
            .map(|_| QMatrix::new(ty, ROWS, cols, Bytes::from_vec(w.data().to_vec())).unwrap())
            .collect();
        for (n_tokens, cold) in [(1usize, false), (1, true), (512, false)] {
            let mut out = vec![0f32; n_tokens * ROWS];
            let xs = &x[..n_tokens * cols];
            // Warm-up (and page in the ring).
            for m in if cold {
                &ring[..]
            } else {
                std::slice::from_ref(&w)
            } {
                matmul(xs, n_tokens, m, &mut out);
            }
            let inner = if n_tokens == 1 {
                if cold {
                    n_copies
                } else {
                    50
                }
            } else {
                1
            };
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let (t0, c0) = (Instant::now(), thread_cpu_ns());
                for i in 0..inner {
                    let m = if cold { &ring[i % n_copies] } else { &w };
                    matmul(xs, n_tokens, m, &mut out);
                }
                let secs = match (cpu_clock, c0, thread_cpu_ns()) {
                    (true, Some(a), Some(b)) => (b - a) as f64 * 1e-9,
                    _ => t0.elapsed().as_secs_f64(),
                };
                times.push(secs / inner as f64);
            }
            let (med, min, max) = median_min_max(times);
            let gbs = bytes as f64 / med / 1e9;
            let gflops = 2.0 * (n_tokens * ROWS * cols) as f64 / med / 1e9;
            println!(
                "{:<6} {:>9} {:>6} {:>12.3} {:>10.1} {:>10.1}  ({:.3}..{:.3})",
                ty.name(),
                format!("{n_tokens}x{cols}"),
                if n_tokens > 1 {
                    "-"
                } else if cold {
                    "cold"
                } else {
                    "hot"
                },
                med * 1e3,
                gbs,
                gflops,
                min * 1e3,
                max * 1e3
            );
            std::hint::black_box(&out);
        }
    }
}
