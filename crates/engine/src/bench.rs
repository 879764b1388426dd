//! Output-throughput measurement of a running engine (`mlaserve bench` wires this).
//!
//! `concurrency` client threads each submit requests back to back (fixed prompt length,
//! `ignore_eos`, fixed output length, greedy), so the engine sees `concurrency` sequences at
//! once. Prompts are random token ids from a seeded stream, so runs are repeatable.

use std::time::Instant;

use crate::error::EngineError;
use crate::handle::{collect_output, EngineHandle};
use crate::request::GenerateRequest;
use crate::rng::Rng;
use crate::sampling_params::SamplingParams;

/// One benchmark point.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub concurrency: usize,
    /// Total requests (rounded up to a multiple of `concurrency`).
    pub num_requests: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    pub seed: u64,
}

/// Measured figures of one point.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub concurrency: usize,
    pub num_requests: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    pub total_output_tokens: usize,
    pub elapsed_s: f64,
    /// Generated tokens per second over the whole run.
    pub output_tok_per_s: f64,
    /// Mean time to first token.
    pub mean_ttft_s: f64,
    /// Mean time per output token after the first.
    pub mean_tpot_s: f64,
}

/// Timing of one request.
#[derive(Debug, Clone, Copy)]
struct RequestTiming {
    ttft_s: f64,
    total_s: f64,
    num_tokens: usize,
}

/// Runs one benchmark point against `handle`.
pub fn bench_throughput(
    handle: &EngineHandle,
    cfg: &BenchConfig,
) -> Result<BenchResult, EngineError> {
    if cfg.concurrency == 0 || cfg.output_len == 0 || cfg.prompt_len == 0 {
        return Err(EngineError::InvalidRequest(
            "bench: concurrency, prompt_len and output_len must be >= 1".into(),
        ));
    }
    let per_client = cfg.num_requests.div_ceil(cfg.concurrency).max(1);
    let vocab = handle.model_config().vocab_size as u64;
    let start = Instant::now();
    let results: Vec<Result<Vec<RequestTiming>, EngineError>> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..cfg.concurrency)
            .map(|c| {
                s.spawn(move || {
                    let mut rng = Rng::seed_from_u64(
                        cfg.seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    );
                    let mut timings = Vec::with_capacity(per_client);
                    for _ in 0..per_client {
                        let prompt_tokens = (0..cfg.prompt_len)
                            .map(|_| (rng.next_u64() % vocab) as u32)
                            .collect();
                        let params = SamplingParams {
                            ignore_eos: true,
                            ..SamplingParams::greedy(cfg.output_len)
                        };
                        let t0 = Instant::now();
                        let mut stream = handle.add(GenerateRequest {
                            prompt_tokens,
                            params,
                        })?;
                        // First event = first token.
                        let first = stream.blocking_recv();
                        let ttft = t0.elapsed().as_secs_f64();
                        let mut n =
                            usize::from(matches!(first, Some(crate::RequestEvent::Token { .. })));
                        let rest = collect_output(stream)?;
                        n += rest.token_ids.len();
                        timings.push(RequestTiming {
                            ttft_s: ttft,
                            total_s: t0.elapsed().as_secs_f64(),
                            num_tokens: n,
                        });
                    }
                    Ok(timings)
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(EngineError::Model("bench client panicked".into())))
            })
            .collect()
    });
    let elapsed_s = start.elapsed().as_secs_f64();
    let timings: Vec<RequestTiming> = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    let total_output_tokens: usize = timings.iter().map(|t| t.num_tokens).sum();
    let n = timings.len().max(1) as f64;
    let mean_ttft_s = timings.iter().map(|t| t.ttft_s).sum::<f64>() / n;
    let tpots: Vec<f64> = timings
        .iter()
        .filter(|t| t.num_tokens > 1)
        .map(|t| (t.total_s - t.ttft_s) / (t.num_tokens - 1) as f64)
        .collect();
    let mean_tpot_s = if tpots.is_empty() {
        0.0
    } else {
        tpots.iter().sum::<f64>() / tpots.len() as f64
    };
    Ok(BenchResult {
        concurrency: cfg.concurrency,
        num_requests: timings.len(),
        prompt_len: cfg.prompt_len,
        output_len: cfg.output_len,
        total_output_tokens,
        elapsed_s,
        output_tok_per_s: total_output_tokens as f64 / elapsed_s.max(1e-9),
        mean_ttft_s,
        mean_tpot_s,
    })
}
