//! `CudaTpExecutor`: tensor (or expert) parallelism over N GPUs of one host, one thread and
//! one stream per GPU, NCCL all-reduce of the partial attention and FFN outputs.
//!
//! Rank r drives GPU `first_device + r` and holds `Model::load` with `Shard { rank: r, .. }`
//! (the CPU path's sharding: heads, FFN slices or whole experts; see
//! `mlaserve_model::parallel::shard`). Every rank runs every step on the same batch; rank 0
//! returns the logits. Invariants: a failing or panicking rank ends the step with that
//! rank's error (its peers' collectives time out and abort instead of hanging); every rank
//! answers every command, so the executor never waits on a rank that already failed for
//! longer than the timeout.

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
    InitCache(usize, usize),
    /// The batch and the step number every rank gives its probes.
    Forward(Arc<ForwardBatch>, u64),
}

/// Logits (rank 0) and the seconds this step spent in all-reduce.
type Reply = std::result::Result<(Vec<f32>, f64), String>;

struct Rank {
    tx: Option<Sender<Cmd>>,
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
}

fn panic_msg(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

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
    rx: Receiver<Cmd>,
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
        let comm = NcclComm::new(&gpu, id, rank, world, timeout)?;
        CudaExecutor::on(Arc::new(model), gpu, Some(comm))
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
    while let Ok(cmd) = rx.recv() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &cmd {
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
        if tx.send(reply).is_err() || failed {
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
        for r in readies {
            match r.recv() {
                Ok(Ok((c, d))) => {
                    config.get_or_insert(c);
                    devices.push(d);
                }
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push("a rank exited while loading".into()),
            }
        }
        if !errors.is_empty() {
            return Err(CudaError::Invalid(errors.join("; ")));
        }
        let config = config.ok_or_else(|| CudaError::Invalid("no ranks".into()))?;
        let path_default = opts.attention_path;
        Ok(Self {
            config,
            path: path_default,
            ranks,
            timeout,
            device: format!("cuda tp={world} [{}]", devices.join(", ")),
            comm_seconds: 0.0,
            step: 0,
        })
    }

    /// Sends `cmd` to every rank and collects every reply; the first error wins.
    fn all(&mut self, mk: impl Fn() -> Cmd) -> std::result::Result<Vec<f32>, ModelError> {
        for (r, rank) in self.ranks.iter().enumerate() {
            let sent = rank
                .tx
                .as_ref()
                .map(|t| t.send(mk()).is_ok())
                .unwrap_or(false);
            if !sent {
                return Err(ModelError::Batch(format!(
                    "tensor-parallel rank {r} has stopped"
                )));
            }
        }
        let mut out = Vec::new();
        let mut err = None;
        // A peer's wait gives up after `timeout`; allow that plus margin per rank.
        let deadline = self.timeout * 2 + Duration::from_secs(5);
        for (r, rank) in self.ranks.iter().enumerate() {
            match rank.rx.recv_timeout(deadline) {
                Ok(Ok((v, secs))) => {
                    if r == 0 {
                        out = v;
                        self.comm_seconds += secs;
                    }
                }
                Ok(Err(e)) => {
                    err.get_or_insert(e);
                }
                Err(_) => {
                    err.get_or_insert(format!("rank {r} did not answer within {deadline:?}"));
                }
            }
        }
        match err {
            Some(e) => Err(ModelError::Batch(format!(
                "tensor-parallel step failed: {e}"
            ))),
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
        for r in &mut self.ranks {
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}
