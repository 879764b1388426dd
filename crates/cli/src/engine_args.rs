//! Engine flags shared by `generate`, `chat` and `serve`, and loading a model into an engine.

use crate::device::{load_executor, DeviceArgs};
use anyhow::{Context, Result};
use clap::Args;
use mlaserve_engine::{start_engine_with, EngineConfig, EngineHandle};
use mlaserve_model::{gguf::GgufFile, LoadOptions};
use mlaserve_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// A .gguf file or an HF directory; default: the bundled model (models/default.gguf).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 128)]
    pub max_num_seqs: usize,
    /// Token budget of one engine step; longer prompts are prefilled in chunks.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + output); default: the model's context, capped by the cache.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Tokens per latent-cache block.
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,
    /// Latent-cache memory in GiB (ignored with --num-blocks).
    #[arg(long, default_value_t = 2.0)]
    pub cache_gib: f64,
    /// Latent-cache blocks (overrides --cache-gib).
    #[arg(long)]
    pub num_blocks: Option<usize>,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Requests allowed to wait before new ones are refused (HTTP 429).
    #[arg(long, default_value_t = 1024)]
    pub max_waiting: usize,
}

impl EngineArgs {
    pub fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(crate::default_model)
    }

    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            cache_memory_bytes: (self.cache_gib * (1u64 << 30) as f64) as usize,
            max_model_len: self.max_model_len,
            enable_prefix_caching: !self.no_prefix_caching,
            max_waiting: self.max_waiting,
            seed: None,
        }
    }
}

/// The tokenizer of a model: from its GGUF metadata, or tokenizer.json in an HF directory.
pub fn tokenizer_for(path: &Path) -> Result<Tokenizer> {
    let tok = if path.is_dir() {
        Tokenizer::from_hf_dir(path)
    } else {
        let file = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
        Tokenizer::from_gguf(&file)
    };
    tok.with_context(|| format!("tokenizer of {}", path.display()))
}

/// Load the model's tokenizer, then the model onto its device, and start the engine thread.
pub fn start(args: &EngineArgs) -> Result<EngineHandle> {
    let path = args.model_path();
    // the tokenizer first: a file without one fails in a second, not after its weights load
    let tokenizer = Arc::new(tokenizer_for(&path)?);
    let exec = load_executor(&path, &args.device, &LoadOptions::default())?;
    start_engine_with(exec, tokenizer, args.engine_config())
        .map_err(|e| anyhow::anyhow!("starting the engine: {e}"))
}
