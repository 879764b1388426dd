//! Tensor and expert parallelism on CPU: ranks on threads of one process.
//!
//! - [`comm`]: the [`Communicator`] trait (all-reduce, all-gather, broadcast; every call can
//!   time out or be aborted, never hang) and [`ThreadComm`], its in-process implementation.
//! - [`shard`]: which slice of the weights a rank holds ([`Shard`]).
//! - [`tp_executor`]: [`TpExecutor`], an [`crate::Executor`] over N worker threads.
//!
//! A sharded step: every rank computes the replicated parts (norms, `q_a`, `kv_a`, the latent
//! cache write, the DSA indexer, the router), its heads' attention and its FFN slice; the
//! partial `[T, H]` after `o_proj` and after the FFN are all-reduced before each residual add.

pub mod comm;
pub mod shard;
pub mod tp_executor;

pub use comm::{CommError, Communicator, ThreadComm, DEFAULT_TIMEOUT};
pub use shard::Shard;
pub use tp_executor::{Fault, RankPools, TpExecutor, TpOptions};
