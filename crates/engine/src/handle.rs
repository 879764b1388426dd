//! `EngineHandle`: the cloneable, thread-safe front of the engine, and `start_engine`.
//!
//! Requests are validated here, on the caller's thread, so the engine loop only ever sees
//! well-formed requests. `add` returns a [`RequestStream`]; dropping it aborts the request.
//! When every handle is dropped the engine finishes its live requests and exits.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mlaserve_model::{CpuExecutor, Executor, Model, ModelConfig};
use mlaserve_tokenizer::Tokenizer;

use crate::config::EngineConfig;
use crate::engine::{Command, EngineLoop};
use crate::error::EngineError;
use crate::metrics::EngineMetrics;
use crate::model_runner::ModelRunner;
use crate::request::{
    FinishReason, GenerateRequest, RequestEvent, RequestId, RequestStream, TokenLogprob, Usage,
};
use crate::rng::Rng;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// State shared by the handles and the engine thread (no command sender: the loop must see
/// the channel close when the last handle goes).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Requests added but never admitted (the `max_waiting` cap counts these).
    pub num_queued: AtomicUsize,
    pub metrics: Mutex<EngineMetrics>,
}

struct Inner {
    cmd_tx: Sender<Command>,
    shared: Arc<Shared>,
    config: Arc<ModelConfig>,
    device: String,
    tokenizer: Arc<Tokenizer>,
    max_model_len: usize,
    max_waiting: usize,
    next_id: AtomicU64,
    is_shutting_down: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Cloneable handle to a running engine; `Send + Sync`.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("max_model_len", &self.inner.max_model_len)
            .finish_non_exhaustive()
    }
}

/// Loads nothing: takes a loaded model and tokenizer, runs it on the CPU
/// ([`CpuExecutor`]), sizes the latent cache from `cfg`, and spawns the engine thread.
pub fn start_engine(
    model: Model,
    tokenizer: Arc<Tokenizer>,
    cfg: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    start_engine_with(Box::new(CpuExecutor::new(Arc::new(model))), tokenizer, cfg)
}

/// [`start_engine`] on any executor (a GPU, tensor-parallel ranks).
pub fn start_engine_with(
    executor: Box<dyn Executor>,
    tokenizer: Arc<Tokenizer>,
    cfg: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    let config = Arc::new(executor.config().clone());
    let resolved = cfg.resolve(&config).map_err(EngineError::InvalidRequest)?;
    if tokenizer.vocab_size() > config.vocab_size {
        tracing::warn!(
            tokenizer = tokenizer.vocab_size(),
            model = config.vocab_size,
            "the tokenizer knows more ids than the model's vocabulary"
        );
    }
    let scheduler = Scheduler::new(SchedulerConfig {
        max_num_seqs: cfg.max_num_seqs,
        max_num_batched_tokens: cfg.max_num_batched_tokens,
        block_size: cfg.block_size,
        num_blocks: resolved.num_blocks,
        enable_prefix_caching: cfg.enable_prefix_caching,
    });
    let runner = ModelRunner::new(executor, resolved.num_blocks, cfg.block_size)
        .map_err(|e| EngineError::Model(format!("allocating the latent cache: {e}")))?;
    let device = runner.device();
    let seed = cfg.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let shared = Arc::new(Shared::default());
    let (cmd_tx, cmd_rx) = std::sync::mpsc::channel();
    let engine_loop = EngineLoop::new(
        shared.clone(),
        cmd_rx,
        scheduler,
        runner,
        tokenizer.clone(),
        resolved.max_model_len,
        Rng::seed_from_u64(seed),
    );
    let thread = std::thread::Builder::new()
        .name("mlaserve-engine".into())
        .spawn(move || engine_loop.run())
        .map_err(|e| EngineError::Model(format!("cannot spawn the engine thread: {e}")))?;
    tracing::info!(
        num_blocks = resolved.num_blocks,
        block_size = cfg.block_size,
        max_model_len = resolved.max_model_len,
        device = %device,
        "engine started"
    );
    Ok(EngineHandle {
        inner: Arc::new(Inner {
            cmd_tx,
            shared,
            config,
            device,
            tokenizer,
            max_model_len: resolved.max_model_len,
            max_waiting: cfg.max_waiting,
            next_id: AtomicU64::new(0),
            is_shutting_down: AtomicBool::new(false),
            thread: Mutex::new(Some(thread)),
        }),
    })
}

impl EngineHandle {
    /// Validates and queues a request; events arrive on the returned stream.
    pub fn add(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        let inner = &self.inner;
        if inner.is_shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::Shutdown);
        }
        self.validate(&req)?;
        if inner.shared.num_queued.fetch_add(1, Ordering::AcqRel) >= inner.max_waiting {
            inner.shared.num_queued.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::QueueFull);
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if inner
            .cmd_tx
            .send(Command::Add {
                id,
                request: req,
                tx,
            })
            .is_err()
        {
            inner.shared.num_queued.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::Shutdown);
        }
        Ok(RequestStream { id, rx })
    }

    fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        let vocab_size = self.inner.config.vocab_size;
        let prompt = &req.prompt_tokens;
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if prompt.len() >= self.inner.max_model_len {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                max: self.inner.max_model_len,
            });
        }
        if let Some((pos, &id)) = prompt
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab_size)
        {
            return Err(EngineError::InvalidRequest(format!(
                "prompt token id {id} at position {pos} is outside the vocabulary of {vocab_size}"
            )));
        }
        req.params
            .validate(vocab_size)
            .map_err(EngineError::InvalidRequest)
    }

    /// Aborts a request (its stream gets `Finished { reason: Abort }`); unknown ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.cmd_tx.send(Command::Abort(id));
    }

    /// The counters as of the engine's last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.inner
            .shared
            .metrics
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.inner.config
    }

    /// Where the model runs ("cpu", "cuda:0", "cpu tp=2").
    pub fn device(&self) -> &str {
        &self.inner.device
    }

    /// Longest sequence (prompt + output) the engine serves.
    pub fn max_model_len(&self) -> usize {
        self.inner.max_model_len
    }

    /// Stops accepting requests; the engine finishes every live request, then its thread
    /// exits (join with [`wait`](Self::wait)).
    pub fn shutdown(&self) {
        self.inner.is_shutting_down.store(true, Ordering::Release);
        let _ = self.inner.cmd_tx.send(Command::Shutdown);
    }

    /// Blocks until the engine thread has exited (after [`shutdown`](Self::shutdown)).
    /// Returns at once if another caller already joined it.
    pub fn wait(&self) {
        let thread = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("the engine thread panicked");
            }
        }
    }

    /// Submits every request, then collects each one's output, blocking. The requests run
    /// batched together in the engine. Not for use inside an async runtime.
    pub fn generate_blocking(
        &self,
        requests: Vec<GenerateRequest>,
    ) -> Vec<Result<GenerateOutput, EngineError>> {
        let streams: Vec<_> = requests.into_iter().map(|r| self.add(r)).collect();
        streams
            .into_iter()
            .map(|s| s.and_then(collect_output))
            .collect()
    }
}

/// Everything one request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    pub id: RequestId,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
}

/// Drains a stream to its end.
pub fn collect_output(mut stream: RequestStream) -> Result<GenerateOutput, EngineError> {
    let mut out = GenerateOutput {
        id: stream.id,
        token_ids: Vec::new(),
        text: String::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Abort,
        usage: Usage::default(),
    };
    loop {
        match stream.blocking_recv() {
            Some(RequestEvent::Token {
                token_id,
                text,
                logprob,
            }) => {
                out.token_ids.push(token_id);
                out.text.push_str(&text);
                out.logprobs.extend(logprob);
            }
            Some(RequestEvent::Finished { reason, usage }) => {
                out.finish_reason = reason;
                out.usage = usage;
                return Ok(out);
            }
            Some(RequestEvent::Error(msg)) => return Err(EngineError::Model(msg)),
            None => return Err(EngineError::Shutdown),
        }
    }
}
