//! `mlaserve serve`: the OpenAI-compatible server. It listens at once (`/health` answers 503
//! while the model loads, then 200) and drains on SIGTERM/SIGINT, exiting 0 (at once if the
//! model is still loading). A model without a tokenizer fails before its weights load.

use crate::engine_args::{self, EngineArgs};
use anyhow::Result;
use clap::Args;
use mlaserve_server::{AppState, ServerConfig};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name clients use; default: the file's stem.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "MLASERVE_API_KEY")]
    pub api_key: Option<String>,
}

pub fn run(a: ServeArgs) -> Result<()> {
    let path = a.engine.model_path();
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "mlaserve".into())
    });
    let cfg = ServerConfig {
        host: a.host.clone(),
        port: a.port,
        served_model_name: name,
        max_model_len: a.engine.max_model_len,
        api_key: a.api_key.clone(),
        ..ServerConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let state = AppState::new(cfg);
        let mut server = tokio::spawn(mlaserve_server::serve_state(
            state.clone(),
            mlaserve_server::shutdown_signal(),
        ));
        let engine = a.engine.clone();
        let load = tokio::task::spawn_blocking(move || engine_args::start(&engine));
        let handle = tokio::select! {
            loaded = load => loaded??,
            // SIGTERM/SIGINT before the model is ready: nothing to drain, so stop now rather
            // than after a load that can take minutes (the loading thread ends with the process)
            stopped = &mut server => {
                let stopped = stopped?;
                if stopped.is_ok() {
                    tracing::info!("stopped while the model was loading");
                }
                return stopped; // (or the server failed, e.g. its port taken: that error)
            }
        };
        if state.set_engine(handle.clone()).is_err() {
            anyhow::bail!("engine installed twice");
        }
        tracing::info!("model ready");
        // The engine drains whatever way the server ended (a signal, an error, a panic).
        let result = server.await;
        handle.shutdown();
        tokio::task::spawn_blocking(move || handle.wait()).await?;
        result?
    });
    // Dropping the runtime would wait for a load still running (blocking tasks are not
    // cancelled); everything that must finish was awaited above.
    rt.shutdown_background();
    result
}
