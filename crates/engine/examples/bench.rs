//! Engine output throughput at 1, 4 and 16 concurrent sequences (greedy, EOS ignored).
//!
//! Run: `cargo run --release -p mlaserve-engine --example bench -- MODEL.gguf [PROMPT_LEN OUTPUT_LEN]`
//! Prints one JSON object per concurrency level.

use std::path::PathBuf;
use std::sync::Arc;

use mlaserve_engine::bench::{bench_throughput, BenchConfig};
use mlaserve_engine::{start_engine, EngineConfig};
use mlaserve_model::{LoadOptions, Model};
use mlaserve_tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .ok_or("usage: bench MODEL.gguf [PROMPT_LEN OUTPUT_LEN]")?,
    );
    let prompt_len: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let output_len: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let model = Model::load(&path, &LoadOptions::default())?;
    let tokenizer = match model.gguf() {
        Some(f) => Tokenizer::from_gguf(f)?,
        None => Tokenizer::from_hf_dir(&path)?,
    };
    let max_model_len = (prompt_len + output_len).next_multiple_of(64);
    let cfg = EngineConfig {
        max_model_len: Some(max_model_len),
        seed: Some(0),
        ..EngineConfig::default()
    };
    let handle = start_engine(model, Arc::new(tokenizer), cfg)?;
    // Warm-up: page in the weights, touch the cache.
    bench_throughput(
        &handle,
        &BenchConfig {
            concurrency: 1,
            num_requests: 1,
            prompt_len,
            output_len: 8,
            seed: 1,
        },
    )?;
    for concurrency in [1, 4, 16] {
        let cfg = BenchConfig {
            concurrency,
            num_requests: 2 * concurrency,
            prompt_len,
            output_len,
            seed: 2,
        };
        let r = bench_throughput(&handle, &cfg)?;
        println!(
            "{{\"concurrency\": {}, \"num_requests\": {}, \"prompt_len\": {}, \"output_len\": {}, \
             \"output_tokens\": {}, \"elapsed_s\": {:.3}, \"output_tok_per_s\": {:.1}, \
             \"mean_ttft_ms\": {:.2}, \"mean_tpot_ms\": {:.3}}}",
            r.concurrency,
            r.num_requests,
            r.prompt_len,
            r.output_len,
            r.total_output_tokens,
            r.elapsed_s,
            r.output_tok_per_s,
            r.mean_ttft_s * 1e3,
            r.mean_tpot_s * 1e3
        );
    }
    handle.shutdown();
    handle.wait();
    Ok(())
}
