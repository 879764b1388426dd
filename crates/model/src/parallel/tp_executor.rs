//! `TpExecutor`: N tensor-parallel ranks on worker threads of this process.
//!
//! Each worker thread loads its rank's shard (all ranks in parallel), owns its own
//! [`LatentCache`] (replicated: every rank writes the same rows) and runs
//! [`Model::forward_sharded`] with its [`ThreadComm`]. A step sends the batch to every rank,
//! waits for every rank's answer and returns rank 0's logits.
//!
//! Invariants:
//! - a step never hangs on a failed rank: a rank that errors or panics (caught with
//!   `catch_unwind`) aborts the communicator, so its peers leave their collectives at once;
//!   a rank that stalls makes its peers' collectives time out. The step then returns the
//!   failing rank's own error (not the peers' "rank r failed" echoes), the group is reset
//!   and the executor runs the next step normally;
//! - a worker thread that is gone (it cannot be, short of an abort) makes this and every later
//!   call an error naming its rank;
//! - `Drop` closes the job channels and joins every worker.

use super::comm::{ThreadComm, DEFAULT_TIMEOUT};
use super::shard::Shard;
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::executor::Executor;
use crate::forward_batch::{AttentionPath, ForwardBatch};
use crate::kv_cache::LatentCache;
use crate::model::{LoadOptions, Model};
use crate::parallel::Communicator;
use crate::probe;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Where each rank's kernels (matmuls, per-head attention) find their threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankPools {
    /// Every rank submits to rayon's global pool.
    Shared,
    /// Each rank gets its own pool of this many threads.
    Split(usize),
}

impl RankPools {
    /// The default for `world_size` ranks: the cores split evenly, at least one thread each.
    pub fn auto(world_size: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        RankPools::Split((cores / world_size.max(1)).max(1))
    }
}

/// How to run a tensor-parallel group.
#[derive(Debug, Clone)]
pub struct TpOptions {
    /// Number of ranks (worker threads).
    pub world_size: usize,
    /// Whole routed experts per rank instead of a slice of every expert.
    pub expert_parallel: bool,
    /// How long a collective waits for its peers before failing the step.
    pub timeout: Duration,
    pub pools: RankPools,
}

impl TpOptions {
    /// `world_size` ranks, tensor-parallel experts, the default timeout and pools.
    pub fn new(world_size: usize) -> Self {
        Self {
            world_size,
            expert_parallel: false,
            timeout: DEFAULT_TIMEOUT,
            pools: RankPools::auto(world_size),
        }
    }
}

/// A failure to inject into one rank's next step (tests and failure drills).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Return an error instead of running the step.
    Error,
    /// Panic instead of running the step.
    Panic,
    /// Sleep this long, then run the step.
    Stall(Duration),
}

enum Job {
    InitCache {
        num_blocks: usize,
        block_size: usize,
    },
    Forward {
        batch: Arc<ForwardBatch>,
        step: u64,
    },
    Fault(Fault),
}

type Reply = Result<Vec<f32>, ModelError>;

struct Worker {
    jobs: Option<Sender<Job>>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<()>>,
}

/// Tensor-parallel executor over N worker threads.
pub struct TpExecutor {
    config: ModelConfig,
    attention_path: AttentionPath,
    opts: TpOptions,
    /// A handle on the group, for reading and clearing failures between steps.
    comm: ThreadComm,
    workers: Vec<Worker>,
    step: u64,
    /// A worker that is gone: (rank, why). Every later call fails with it.
    dead: Option<(usize, String)>,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Run `f` as rank `rank`: on its pool, with its probe rank and tracing span, panics caught.
fn on_rank<T: Send>(
    rank: usize,
    pool: Option<&rayon::ThreadPool>,
    f: impl FnOnce() -> Result<T, ModelError> + Send,
) -> Result<T, ModelError> {
    let body = move || {
        probe::set_rank(rank);
        let _span = tracing::info_span!("tp", rank).entered();
        f()
    };
    catch_unwind(AssertUnwindSafe(|| match pool {
        Some(p) => p.install(body),
        None => body(),
    }))
    .unwrap_or_else(|p| {
        Err(ModelError::RankPanicked {
            rank,
            msg: panic_message(p.as_ref()),
        })
    })
}

/// What a worker thread starts with.
struct WorkerInit {
    rank: usize,
    path: PathBuf,
    /// With this rank's shard.
    opts: LoadOptions,
    comm: ThreadComm,
    pools: RankPools,
    /// One message: the loaded model's config, or why it did not load.
    loaded: Sender<Result<ModelConfig, ModelError>>,
    jobs: Receiver<Job>,
    replies: Sender<Reply>,
}

fn worker_main(init: WorkerInit) {
    let WorkerInit {
        rank,
        path,
        opts,
        comm,
        pools,
        loaded,
        jobs,
        replies,
    } = init;
    probe::set_rank(rank);
    let pool = match pools {
        RankPools::Shared => None,
        RankPools::Split(threads) => {
            match rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(move |i| format!("mlaserve-tp{rank}-{i}"))
                .build()
            {
                Ok(p) => Some(p),
                Err(e) => {
                    let _ = loaded.send(Err(ModelError::Io {
                        path: PathBuf::from(format!("rank {rank} thread pool")),
                        msg: e.to_string(),
                    }));
                    return;
                }
            }
        }
    };
    let model = match on_rank(rank, pool.as_ref(), || Model::load(&path, &opts)) {
        Ok(m) => {
            let _ = loaded.send(Ok(m.config().clone()));
            m
        }
        Err(e) => {
            let _ = loaded.send(Err(e));
            return;
        }
    };
    drop(loaded);
    let mut cache: Option<LatentCache> = None;
    let mut fault: Option<Fault> = None;
    while let Ok(job) = jobs.recv() {
        let reply = match job {
            Job::Fault(f) => {
                fault = Some(f);
                Ok(Vec::new())
            }
            Job::InitCache {
                num_blocks,
                block_size,
            } => {
                let cfg = model.config();
                on_rank(rank, pool.as_ref(), || {
                    cache = Some(LatentCache::new(cfg, num_blocks, block_size));
                    Ok(Vec::new())
                })
            }
            Job::Forward { batch, step } => {
                let fault = fault.take();
                let (model, comm, cache) = (&model, &comm, &mut cache);
                let r = on_rank(rank, pool.as_ref(), move || {
                    match fault {
                        Some(Fault::Error) => {
                            return Err(ModelError::Batch(format!(
                                "fault injected into rank {rank}"
                            )))
                        }
                        Some(Fault::Panic) => panic!("fault injected into rank {rank}"),
                        Some(Fault::Stall(d)) => std::thread::sleep(d),
                        None => {}
                    }
                    let cache = cache.as_mut().ok_or_else(|| {
                        ModelError::Batch("forward before init_cache: no latent cache".into())
                    })?;
                    probe::set_next_step(step);
                    model.forward_sharded(&batch, cache, comm)
                });
                if let Err(e) = &r {
                    // Peers waiting in a collective stop now instead of at the timeout.
                    comm.abort(&e.to_string());
                }
                r
            }
        };
        if replies.send(reply).is_err() {
            break;
        }
    }
}

impl TpExecutor {
    /// Load `path` as `opts.world_size` ranks (in parallel, one worker thread each).
    /// `load.shard` is ignored: each rank gets its own. A load error is returned as the lowest
    /// failing rank's.
    pub fn load(path: &Path, load: &LoadOptions, opts: TpOptions) -> Result<Self, ModelError> {
        let world = opts.world_size;
        if world == 0 {
            return Err(ModelError::Config {
                source_name: path.display().to_string(),
                msg: "tensor-parallel size 0".into(),
            });
        }
        let comms = ThreadComm::group(world, opts.timeout);
        let comm = comms[0].clone();
        let mut workers = Vec::with_capacity(world);
        let mut loads = Vec::with_capacity(world);
        for (rank, c) in comms.into_iter().enumerate() {
            let (job_tx, job_rx) = channel();
            let (reply_tx, reply_rx) = channel();
            let (load_tx, load_rx) = channel();
            let mut lo = load.clone();
            lo.shard = Some(Shard {
                rank,
                world_size: world,
                expert_parallel: opts.expert_parallel,
            });
            let init = WorkerInit {
                rank,
                path: path.to_path_buf(),
                opts: lo,
                comm: c,
                pools: opts.pools,
                loaded: load_tx,
                jobs: job_rx,
                replies: reply_tx,
            };
            let handle = std::thread::Builder::new()
                .name(format!("mlaserve-tp{rank}"))
                .spawn(move || worker_main(init))
                .map_err(|e| ModelError::Io {
                    path: PathBuf::from(format!("rank {rank} worker thread")),
                    msg: e.to_string(),
                })?;
            workers.push(Worker {
                jobs: Some(job_tx),
                replies: reply_rx,
                handle: Some(handle),
            });
            loads.push(load_rx);
        }
        let mut config = None;
        let mut first_err = None;
        for (rank, rx) in loads.into_iter().enumerate() {
            match rx.recv() {
                Ok(Ok(cfg)) => {
                    if rank == 0 {
                        config = Some(cfg);
                    }
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(ModelError::Rank {
                        rank,
                        error: Box::new(e),
                    });
                }
                Err(_) => {
                    first_err.get_or_insert(ModelError::RankPanicked {
                        rank,
                        msg: "worker thread exited while loading".into(),
                    });
                }
            }
        }
        let config = match (first_err, config) {
            (None, Some(cfg)) => cfg,
            (err, _) => {
                shutdown(&mut workers);
                return Err(err.unwrap_or_else(|| ModelError::RankPanicked {
                    rank: 0,
                    msg: "no configuration from rank 0".into(),
                }));
            }
        };
        Ok(TpExecutor {
            config,
            attention_path: load.attention_path,
            opts,
            comm,
            workers,
            step: 0,
            dead: None,
        })
    }

    /// The options the group runs with.
    pub fn options(&self) -> &TpOptions {
        &self.opts
    }

    /// Make `rank` fail its next forward step with `fault` (tests and failure drills).
    pub fn inject_fault(&mut self, rank: usize, fault: Fault) -> Result<(), ModelError> {
        self.check_alive()?;
        let w = self.workers.get(rank).ok_or_else(|| {
            ModelError::Batch(format!(
                "no rank {rank} in a group of {}",
                self.workers.len()
            ))
        })?;
        let sent = w
            .jobs
            .as_ref()
            .is_some_and(|j| j.send(Job::Fault(fault)).is_ok());
        match sent.then(|| w.replies.recv()) {
            Some(Ok(r)) => r.map(|_| ()),
            _ => Err(self.mark_dead(rank, "worker thread is gone")),
        }
    }

    fn check_alive(&self) -> Result<(), ModelError> {
        match &self.dead {
            Some((rank, why)) => Err(ModelError::RankPanicked {
                rank: *rank,
                msg: format!("{why}; the tensor-parallel executor cannot run"),
            }),
            None => Ok(()),
        }
    }

    fn mark_dead(&mut self, rank: usize, why: &str) -> ModelError {
        self.comm.abort(&format!("rank {rank}: {why}"));
        self.dead.get_or_insert((rank, why.to_string()));
        ModelError::RankPanicked {
            rank,
            msg: why.to_string(),
        }
    }

    /// Send one job per rank, wait for every rank's reply; rank 0's on success, else the root
    /// cause (see the module invariants).
    fn run(&mut self, make: impl Fn() -> Job) -> Result<Vec<f32>, ModelError> {
        self.check_alive()?;
        let n = self.workers.len();
        let sent: Vec<bool> = self
            .workers
            .iter()
            .map(|w| w.jobs.as_ref().is_some_and(|j| j.send(make()).is_ok()))
            .collect();
        let mut replies: Vec<Reply> = Vec::with_capacity(n);
        for (rank, sent) in sent.into_iter().enumerate() {
            let reply = match sent.then(|| self.workers[rank].replies.recv()) {
                Some(Ok(r)) => r,
                _ => Err(self.mark_dead(rank, "worker thread is gone")),
            };
            replies.push(reply);
        }
        if replies.iter().all(Result::is_ok) {
            return replies.swap_remove(0);
        }
        // Every rank has answered, so none is inside a collective: safe to reset.
        self.comm.reset();
        let mut errs: Vec<(usize, ModelError)> = replies
            .into_iter()
            .enumerate()
            .filter_map(|(r, x)| x.err().map(|e| (r, e)))
            .collect();
        let root = errs
            .iter()
            .position(|(r, e)| !matches!(e, ModelError::Comm(c) if c.is_peer_failure(*r)))
            .unwrap_or(0);
        let (rank, err) = errs.swap_remove(root);
        Err(match err {
            e @ (ModelError::Comm(_)
            | ModelError::RankPanicked { .. }
            | ModelError::Rank { .. }) => e,
            e => ModelError::Rank {
                rank,
                error: Box::new(e),
            },
        })
    }
}

/// Close the job channels and join the workers.
fn shutdown(workers: &mut [Worker]) {
    for w in workers.iter_mut() {
        w.jobs = None;
    }
    for w in workers.iter_mut() {
        if let Some(h) = w.handle.take() {
            let _ = h.join();
        }
    }
}

impl Executor for TpExecutor {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn attention_path(&self) -> AttentionPath {
        self.attention_path
    }

    fn init_cache(&mut self, num_blocks: usize, block_size: usize) -> Result<(), ModelError> {
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::Batch(format!(
                "cache of {num_blocks} blocks of {block_size} slots"
            )));
        }
        self.run(|| Job::InitCache {
            num_blocks,
            block_size,
        })
        .map(|_| ())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, ModelError> {
        let batch = Arc::new(batch.clone());
        let step = self.step;
        self.step += 1;
        self.run(|| Job::Forward {
            batch: batch.clone(),
            step,
        })
    }

    fn device(&self) -> String {
        format!(
            "cpu tp={}{}",
            self.opts.world_size,
            if self.opts.expert_parallel { " ep" } else { "" }
        )
    }
}

impl Drop for TpExecutor {
    fn drop(&mut self) {
        shutdown(&mut self.workers);
    }
}
