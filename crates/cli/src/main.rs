//! `mlaserve`: the command-line entry point.
//!
//! Every command accepts `--trace GLOB[:N]` (or `MLASERVE_TRACE`) and `--dump DIR`, which turn
//! on the model's named tensor probes (see `mlaserve_model::probe`).

mod cmd;
mod device;
mod engine_args;
mod npy;

use anyhow::Result;
use clap::{Parser, Subcommand};
use mlaserve_model::{AttentionPath, LoadOptions};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "mlaserve",
    version,
    about = "Inference engine and OpenAI-compatible server for MLA models (DeepSeek-V2/V3, GLM-5)"
)]
struct Cli {
    /// Print one line per hit of the matching probes (e.g. `L0.mla.*:4`, `*attn_out`).
    #[arg(long, global = true, env = "MLASERVE_TRACE")]
    trace: Option<String>,
    /// Write the probes matching --dump-glob as safetensors (one file per step and rank) to DIR.
    #[arg(long, global = true)]
    dump: Option<PathBuf>,
    /// Which probes --dump writes.
    #[arg(long, global = true, default_value = "*")]
    dump_glob: String,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /metrics).
    Serve(cmd::serve::ServeArgs),
    /// Generate from prompts, batched through the engine (greedy unless --temperature > 0).
    Generate(cmd::generate::GenerateArgs),
    /// Chat interactively (streaming; the conversation is kept).
    Chat(cmd::chat::ChatArgs),
    /// Show a GGUF file: metadata, tensors, the derived model config and warnings.
    Inspect { file: PathBuf },
    /// Write float32 logits [tokens, vocab] of a token sequence as .npy.
    Logits {
        #[arg(long)]
        model: PathBuf,
        /// Comma-separated token ids.
        #[arg(long)]
        tokens: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "auto")]
        attention_path: AttentionPath,
        /// Feed the sequence N tokens at a time (chunked prefill over the cached context).
        #[arg(long, default_value_t = 0)]
        prefill_chunk: usize,
        #[command(flatten)]
        device: device::DeviceArgs,
    },
    /// Check a model file: metadata, the three attention paths against each other, norms layer
    /// by layer, and (with --reference) the first probe that departs from an HF dump.
    Doctor {
        model: PathBuf,
        /// A safetensors dump from tools/hf_dump.py (or --dump) with a `tokens` tensor.
        #[arg(long)]
        reference: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Also print informational findings.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Benchmark prompt processing and generation (llama-bench style).
    Bench {
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
        n_prompt: usize,
        #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
        n_gen: usize,
        #[arg(short = 'r', long, default_value_t = 5)]
        reps: usize,
        /// Decode batch sizes for tg (comma-separated): B sequences decode together.
        #[arg(short = 'b', long, value_delimiter = ',', default_value = "1")]
        batch: Vec<usize>,
        /// What each tg step hands back: every row's argmax (greedy generation), a token
        /// drawn at temperature 1 on the device (`sample`; `sample-filtered`: with top-k 50 and
        /// top-p 0.95), or the whole logits rows (a sampler with penalties or logprobs reads
        /// them).
        #[arg(long, value_enum, default_value = "argmax")]
        tg_logits: cmd::bench::TgLogits,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        device: device::DeviceArgs,
    },
}

/// The bundled default model, used when a command gets no --model.
pub fn default_model() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default.gguf");
    p.canonicalize().unwrap_or(p)
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MLASERVE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let dump = cli.dump.clone().map(|d| (d, cli.dump_glob.as_str()));
    if cli.trace.is_some() || dump.is_some() {
        mlaserve_model::probe::configure(cli.trace.as_deref(), dump);
    }
    match cli.cmd {
        Command::Serve(a) => cmd::serve::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Inspect { file } => cmd::inspect::run(&file),
        Command::Logits {
            model,
            tokens,
            out,
            attention_path,
            prefill_chunk,
            device,
        } => {
            let tokens = cmd::logits::parse_tokens(&tokens)?;
            let mut exec = device::load_executor(&model, &device, &LoadOptions::default())?;
            cmd::logits::run(exec.as_mut(), &tokens, attention_path, prefill_chunk, &out)
        }
        Command::Doctor {
            model,
            reference,
            json,
            verbose,
        } => {
            if !cmd::doctor::run(&model, reference.as_deref(), json, verbose)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Bench {
            model,
            n_prompt,
            n_gen,
            reps,
            batch,
            tg_logits,
            json,
            device,
        } => {
            if batch.contains(&0) {
                anyhow::bail!("--batch sizes must be at least 1");
            }
            let path = model.unwrap_or_else(default_model);
            let mut exec = device::load_executor(&path, &device, &LoadOptions::default())?;
            let name = path.display().to_string();
            cmd::bench::run(
                exec.as_mut(),
                &name,
                n_prompt,
                n_gen,
                &batch,
                reps.max(1),
                tg_logits,
                json,
            )
        }
    }
}
