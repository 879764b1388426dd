//! `mlaserve generate`: prompts batched through the engine; greedy by default.

use crate::engine_args::{self, EngineArgs};
use anyhow::{bail, Result};
use clap::Args;
use mlaserve_engine::{GenerateRequest, SamplingParams};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// A prompt (repeat for several; they run batched together).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// Comma-separated token ids instead of --prompt.
    #[arg(long)]
    pub tokens: Option<String>,
    /// Wrap each prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print {"tokens": [...], "text": "..."} per prompt (generated ids only).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    if a.prompt.is_empty() && a.tokens.is_none() {
        bail!("give --prompt TEXT (one or more) or --tokens IDS");
    }
    let handle = engine_args::start(&a.engine)?;
    let tok = handle.tokenizer().clone();
    let params = SamplingParams {
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        seed: a.seed,
        ignore_eos: a.ignore_eos,
        ..SamplingParams::greedy(a.max_tokens)
    };
    let mut prompts: Vec<(String, Vec<u32>)> = Vec::new();
    if let Some(t) = &a.tokens {
        prompts.push((t.clone(), crate::cmd::logits::parse_tokens(t)?));
    }
    for p in &a.prompt {
        let ids = if a.chat {
            let tmpl = tok.chat_template().ok_or_else(|| {
                anyhow::anyhow!(
                    "the model has no chat template{}",
                    tok.chat_template_error()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )
            })?;
            let text = tmpl.render(&[mlaserve_tokenizer::ChatMessage::new("user", p)], true)?;
            tok.encode(&text, false)?
        } else {
            tok.encode(p, true)?
        };
        prompts.push((p.clone(), ids));
    }
    let reqs = prompts
        .iter()
        .map(|(_, ids)| GenerateRequest {
            prompt_tokens: ids.clone(),
            params: params.clone(),
        })
        .collect();
    let outs = handle.generate_blocking(reqs);
    for ((prompt, _), out) in prompts.iter().zip(outs) {
        let out = out.map_err(|e| anyhow::anyhow!("{e}"))?;
        if a.json {
            println!(
                "{}",
                serde_json::json!({"tokens": out.token_ids, "text": out.text, "finish_reason": out.finish_reason.as_str()})
            );
        } else {
            println!("{prompt}{}", out.text);
        }
    }
    handle.shutdown();
    handle.wait();
    Ok(())
}
