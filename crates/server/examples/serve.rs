//! A minimal server binary for tests and benchmarks, independent of the `mlaserve` CLI:
//!
//! ```text
//! cargo run -p mlaserve-server --example serve -- --model M.gguf [--host H] [--port P]
//!     [--served-model-name NAME] [--max-num-seqs N] [--cache-mb MB] [--block-size B]
//!     [--max-waiting N]
//! ```
//!
//! It starts the server first (so `/health` answers 503 while the model loads), then loads the
//! model, starts the engine and installs it. SIGINT/SIGTERM shut it down gracefully, exit 0.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use mlaserve_engine::{start_engine, EngineConfig};
use mlaserve_model::{LoadOptions, Model};
use mlaserve_server::{serve_state, shutdown_signal, AppState, ServerConfig};
use mlaserve_tokenizer::Tokenizer;

struct Args {
    model: PathBuf,
    server: ServerConfig,
    engine: EngineConfig,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut model = None;
    let mut server = ServerConfig::default();
    let mut engine = EngineConfig {
        cache_memory_bytes: 256 << 20,
        ..EngineConfig::default()
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value()?)),
            "--host" => server.host = value()?,
            "--port" => server.port = value()?.parse().context("--port")?,
            "--served-model-name" => server.served_model_name = value()?,
            "--max-num-seqs" => engine.max_num_seqs = value()?.parse().context("--max-num-seqs")?,
            "--max-waiting" => engine.max_waiting = value()?.parse().context("--max-waiting")?,
            "--block-size" => engine.block_size = value()?.parse().context("--block-size")?,
            "--cache-mb" => {
                engine.cache_memory_bytes = value()?.parse::<usize>().context("--cache-mb")? << 20
            }
            other => bail!("unknown flag {other}"),
        }
    }
    let model = model.context("--model is required")?;
    Ok(Args {
        model,
        server,
        engine,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args()?;
    let state = AppState::new(args.server);
    let server = tokio::spawn(serve_state(state.clone(), shutdown_signal()));

    let (model_path, engine_cfg) = (args.model, args.engine);
    let engine = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let model = Model::load(&model_path, &LoadOptions::default())
            .with_context(|| format!("loading {}", model_path.display()))?;
        let tokenizer = match model.gguf() {
            Some(gguf) => Tokenizer::from_gguf(gguf),
            None => Tokenizer::from_hf_dir(&model_path),
        }
        .context("building the tokenizer")?;
        Ok(start_engine(model, Arc::new(tokenizer), engine_cfg)?)
    })
    .await??;
    if state.set_engine(engine.clone()).is_err() {
        bail!("engine installed twice");
    }
    tracing::info!("model loaded; ready");

    server.await??;
    engine.shutdown();
    tokio::task::spawn_blocking(move || engine.wait()).await?;
    Ok(())
}
