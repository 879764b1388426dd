//! `mlaserve chat`: an interactive, streaming conversation; the history is kept.

use crate::engine_args::{self, EngineArgs};
use anyhow::{anyhow, Result};
use clap::Args;
use mlaserve_engine::{GenerateRequest, RequestEvent, SamplingParams};
use mlaserve_tokenizer::ChatMessage;
use std::io::{BufRead, Write};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let handle = engine_args::start(&a.engine)?;
    let tok = handle.tokenizer().clone();
    let tmpl = tok.chat_template().ok_or_else(|| {
        anyhow!("the model has no chat template; use `generate` for plain completion")
    })?;
    let mut history: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s))
        .collect();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("chat: type a message, an empty line or Ctrl-D to quit");
    loop {
        print!("> ");
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        history.push(ChatMessage::new("user", line.trim_end()));
        let ids = tok.encode(&tmpl.render(&history, true)?, false)?;
        let params = SamplingParams {
            temperature: a.temperature,
            ..SamplingParams::greedy(a.max_tokens)
        };
        let mut stream = handle
            .add(GenerateRequest {
                prompt_tokens: ids,
                params,
            })
            .map_err(|e| anyhow!("{e}"))?;
        let mut reply = String::new();
        while let Some(ev) = stream.blocking_recv() {
            match ev {
                RequestEvent::Token { text, .. } => {
                    print!("{text}");
                    out.flush()?;
                    reply.push_str(&text);
                }
                RequestEvent::Finished { .. } => break,
                RequestEvent::Error(e) => return Err(anyhow!("generation failed: {e}")),
            }
        }
        println!();
        history.push(ChatMessage::new("assistant", &reply));
    }
    handle.shutdown();
    handle.wait();
    Ok(())
}
