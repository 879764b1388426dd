//! `CudaTpExecutor`: tensor (or expert) parallelism over N GPUs of one host, one thread and
//! one stream per GPU, NCCL all-reduce of the partial attention and FFN outputs.
//!
//! Rank r drives GPU `first_device + r` and holds `Model::load` with `Shard { rank: r, .. }`
//! (the CPU path's sharding: heads, FFN slices or whole experts; see
//! `mlaserve_model::parallel::shard`). Every rank runs every step on the same batch; rank 0
//! returns the logits.
//!
//! Invariants: start is two-phase — every rank opens its GPU and uploads its shard, and only
//! when all have succeeded do they join the NCCL group (a rank that fails to load cannot leave
//! its peers blocked in `ncclCommInitRank`). A failing or panicking rank ends the step with
//! its error and aborts its communicator, so its peers' collectives fail instead of hanging;
//! the executor then stays failed and says why (a rank's CUDA state after a failure is not
//! trusted; restart to recover). Every reply carries its command's sequence number, so a late
//! reply is never taken for a later step's.

use crate::error::{CudaError, Result};
use crate::executor::CudaExecutor;
use crate::gpu::Gpu;
use crate::nccl::{NcclComm, NcclId};
use mlaserve_model::parallel::Shard;
use mlaserve_model::{
    AttentionPath, Executor, ForwardBatch, LoadOptions, Model, ModelConfig, ModelError,
};
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

enum Cmd {
    /// Phase two of the start: create the communicator.
    Join,
    InitCache(usize, usize),
    /// The batch and the step number every rank gives its probes.
    Forward(Arc<ForwardBatch>, u64),
}

/// The command's sequence number, then the logits (rank 0) and the seconds this step spent
/// in all-reduce, or the rank's error.
type Reply = (u64, std::result::Result<(Vec<f32>, f64), String>);

struct Rank {
    tx: Option<Sender<(u64, Cmd)>>,
    rx: Receiver<Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub struct CudaTpExecutor {
    config: ModelConfig,
    path: AttentionPath,
    ranks: Vec<Rank>,
    timeout: Duration,
    device: String,
    /// Rank 0's all-reduce seconds since the last `take_comm_seconds`.
    comm_seconds: f64,
    /// Steps run (probe step numbers agree across ranks).
    step: u64,
    /// Sequence number of the next command.
    seq: u64,
    /// The first failure; once set, every call returns it.
    failed: Option<String>,
}

fn panic_msg(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[allow(clippy::too_many_arguments)]
fn rank_main(
    rank: usize,
    world: usize,
    ordinal: usize,
    path: std::path::PathBuf,
    opts: LoadOptions,
    expert_parallel: bool,
    id: NcclId,
    timeout: Duration,
    ready: Sender<std::result::Result<(ModelConfig, String), String>>,
    rx: Receiver<(u64, Cmd)>,
    tx: Sender<Reply>,
) {
    mlaserve_model::probe::set_rank(rank);
    let setup = || -> Result<CudaExecutor> {
        let mut gpu = Gpu::new(ordinal)?;
        gpu.set_sync_timeout(timeout);
        let shard = Shard {
            rank,
            world_size: world,
            expert_parallel,
        };
        let model = Model::load(
            &path,
            &LoadOptions {
                shard: Some(shard),
                ..opts
            },
        )?;
        CudaExecutor::on(Arc::new(model), gpu, None)
    };
    let mut exec = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(setup)) {
        Ok(Ok(e)) => {
            let _ = ready.send(Ok((e.config().clone(), e.device())));
            e
        }
        Ok(Err(e)) => {
            let _ = ready.send(Err(format!("rank {rank} (cuda:{ordinal}): {e}")));
            return;
        }
        Err(p) => {
            let _ = ready.send(Err(format!(
                "rank {rank} (cuda:{ordinal}) panicked: {}",
                panic_msg(p)
            )));
            return;
        }
    };
    while let Ok((seq, cmd)) = rx.recv() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &cmd {
            Cmd::Join => NcclComm::new(exec.gpu(), id, rank, world, timeout)
                .map(|c| {
                    exec.set_comm(c);
                    (Vec::new(), 0.0)
                })
                .map_err(ModelError::from),
            Cmd::InitCache(nb, bs) => exec.init_cache(*nb, *bs).map(|_| (Vec::new(), 0.0)),
            Cmd::Forward(b, step) => {
                mlaserve_model::probe::set_next_step(*step);
                exec.forward(b)
                    .map(|l| (l, exec.take_comm_seconds().unwrap_or(0.0)))
            }
        }));
        let reply = match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("rank {rank}: {e}")),
            Err(p) => Err(format!("rank {rank} panicked: {}", panic_msg(p))),
        };
        let failed = reply.is_err();
        if failed {
            // A failed rank leaves the group at once: its peers' collectives fail or time out
            // instead of waiting for it.
            exec.abort_comm();
        }
        if tx.send((seq, reply)).is_err() || failed {
            return;
        }
    }
}

impl CudaTpExecutor {
    /// Loads `path` on GPUs `first_device .. first_device + world`, one shard each.
    pub fn load(
        path: &Path,
        opts: &LoadOptions,
        first_device: usize,
        world: usize,
        expert_parallel: bool,
        timeout: Duration,
    ) -> Result<Self> {
        crate::gpu::check_libraries()?;
        crate::nccl::check_nccl()?;
        let count = cudarc::driver::CudaContext::device_count()
            .map_err(|e| CudaError::driver("cuDeviceGetCount", e))? as usize;
        if first_device + world > count {
            return Err(CudaError::Unavailable(format!(
                "--tp {world} from cuda:{first_device} needs {} GPUs, {count} present",
                first_device + world
            )));
        }
        let id = NcclId::new()?;
        let mut ranks = Vec::new();
        let mut readies = Vec::new();
        for rank in 0..world {
            let (ctx, crx) = channel();
            let (rtx, rrx) = channel();
            let (ready_tx, ready_rx) = channel();
            let (p, o) = (path.to_path_buf(), opts.clone());
            let thread = std::thread::Builder::new()
                .name(format!("mlaserve-cuda-rank{rank}"))
                .spawn(move || {
                    rank_main(
                        rank,
                        world,
                        first_device + rank,
                        p,
                        o,
                        expert_parallel,
                        id,
                        timeout,
                        ready_tx,
                        crx,
                        rtx,
                    )
                })
                .map_err(|e| CudaError::Invalid(format!("spawning rank {rank}: {e}")))?;
            ranks.push(Rank {
                tx: Some(ctx),
                rx: rrx,
                thread: Some(thread),
            });
            readies.push(ready_rx);
        }
        let mut config = None;
        let mut devices = Vec::new();
        let mut errors = Vec::new();
        for (rank, r) in readies.into_iter().enumerate() {
            match r.recv() {
                Ok(Ok((c, d))) => {
                    config.get_or_insert(c);
                    devices.push(format!("{d} rank {rank}"));
                }
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push("a rank exited while loading".into()),
            }
        }
        if !errors.is_empty() {
            // Dropping the command channels ends every rank before any joined NCCL.
            return Err(CudaError::Invalid(errors.join("; ")));
        }
        let config = config.ok_or_else(|| CudaError::Invalid("no ranks".into()))?;
        let mut exec = Self {
            config,
            path: opts.attention_path,
            ranks,
            timeout,
            device: format!("cuda tp={world} [{}]", devices.join(", ")),
            comm_seconds: 0.0,
            step: 0,
            seq: 0,
            failed: None,
        };
        // Phase two: every rank loaded; now they join the communicator together.
        exec.all(|| Cmd::Join)
            .map_err(|e| CudaError::Invalid(format!("joining the NCCL group: {e}")))?;
        Ok(exec)
    }

    /// Sends `cmd` to every rank and collects every reply; the first error wins and leaves
    /// the executor failed. Replies to earlier commands (late after a timeout) are dropped.
    fn all(&mut self, mk: impl Fn() -> Cmd) -> std::result::Result<Vec<f32>, ModelError> {
        if let Some(e) = &self.failed {
            return Err(ModelError::Batch(format!(
                "the tensor-parallel executor failed earlier and stays down (restart to recover): {e}"
            )));
        }
        let seq = self.seq;
        self.seq += 1;
        for (r, rank) in self.ranks.iter().enumerate() {
            let sent = rank
                .tx
                .as_ref()
                .map(|t| t.send((seq, mk())).is_ok())
                .unwrap_or(false);
            if !sent {
                let e = format!("tensor-parallel rank {r} has stopped");
                self.failed = Some(e.clone());
                return Err(ModelError::Batch(e));
            }
        }
        let mut out = Vec::new();
        let mut err = None;
        // A peer's wait gives up after `timeout`; allow that plus margin.
        let deadline = std::time::Instant::now() + self.timeout * 2 + Duration::from_secs(5);
        for (r, rank) in self.ranks.iter().enumerate() {
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match rank.rx.recv_timeout(left) {
                    Ok((s, _)) if s < seq => continue, // a late reply to an earlier command
                    Ok((_, Ok((v, secs)))) => {
                        if r == 0 {
                            out = v;
                            self.comm_seconds += secs;
                        }
                    }
                    Ok((_, Err(e))) => {
                        err.get_or_insert(e);
                    }
                    Err(_) => {
                        err.get_or_insert(format!("rank {r} did not answer within the deadline"));
                    }
                }
                break;
            }
        }
        match err {
            Some(e) => {
                self.failed = Some(e.clone());
                Err(ModelError::Batch(format!(
                    "tensor-parallel step failed: {e}"
                )))
            }
            None => Ok(out),
        }
    }
}

impl Executor for CudaTpExecutor {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn attention_path(&self) -> AttentionPath {
        self.path
    }

    fn init_cache(
        &mut self,
        num_blocks: usize,
        block_size: usize,
    ) -> std::result::Result<(), ModelError> {
        self.all(|| Cmd::InitCache(num_blocks, block_size))
            .map(|_| ())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> std::result::Result<Vec<f32>, ModelError> {
        let b = Arc::new(batch.clone());
        let step = self.step;
        self.step += 1;
        self.all(|| Cmd::Forward(b.clone(), step))
    }

    fn device(&self) -> String {
        self.device.clone()
    }

    fn take_comm_seconds(&mut self) -> Option<f64> {
        Some(std::mem::take(&mut self.comm_seconds))
    }
}

impl Drop for CudaTpExecutor {
    fn drop(&mut self) {
        for r in &mut self.ranks {
            r.tx.take();
        }
        // A healthy group exits at once; after a failure a rank may still sit in a driver
        // call, so its thread is left to the process instead of blocking the drop.
        if self.failed.is_none() {
            for r in &mut self.ranks {
                if let Some(t) = r.thread.take() {
                    let _ = t.join();
                }
            }
        }
    }
}
