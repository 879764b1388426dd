//! CUDA graphs for decode steps: the first decode step of a shape is captured (every kernel,
//! cuBLAS call and arena address of the step), later steps of that shape rewrite the step's
//! inputs in place and replay the graph with one launch — no per-kernel host work.
//!
//! Invariants:
//! - A shape ([`GraphKey`]) is the token count and the absorbed kernel's split count: every
//!   launch configuration and scratch size of a decode step follows from those two; context
//!   lengths, positions, slots and block tables are device data the graph reads.
//! - Only steps without host round trips are captured: all tokens decoding, one GPU, no
//!   probes, every position inside the DSA indexer's dense window (past index_topk its
//!   top-k runs on the host), and MoE on the GPU (the executor decides,
//!   `CudaExecutor::graph_key`). The key need not say whether DSA selects: a step with a
//!   position past the window is never looked up.
//! - The graph's inputs live in persistent buffers ([`crate::step_inputs::StepInputs`]); its
//!   intermediates live in the step arena, which is reset per step and never shrinks, so the
//!   captured addresses stay valid; all work is on one stream, so a replay never overlaps an
//!   eager step using the same arena bytes.
//! - A replacement latent cache ([`Graphs::clear`] from init_cache) drops every graph.
//! - A shape whose capture fails runs eagerly from then on (logged once).
//!
//! `MLASERVE_CUDA_GRAPHS=0` turns graphs off (eager steps, for comparisons).

use crate::step_inputs::StepInputs;
use cudarc::driver::CudaGraph;
use std::collections::{HashMap, HashSet};

/// Graphs kept at most (distinct decode shapes).
pub const MAX_GRAPHS: usize = 64;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) struct GraphKey {
    pub tokens: usize,
    pub splits: usize,
    /// Whether the step's attention is `mla_attn_cl` (its rule reads the key count, which
    /// `splits` does not pin down: 16 splits from 961 keys up at b1).
    pub cluster_attn: bool,
}

/// One captured decode step.
pub(crate) struct DecodeGraph {
    pub graph: CudaGraph,
    pub inputs: StepInputs,
    /// Device logits [tokens, vocab] f32 the graph writes (in the step arena).
    pub logits: u64,
    /// The room after them in the arena where a step picked on the device puts each row's
    /// pick and draw (written by copies and a launch after the replay, not by the graph).
    pub picks: u64,
}

pub(crate) struct Graphs {
    pub enabled: bool,
    map: HashMap<GraphKey, Wrapped>,
    refused: HashSet<GraphKey>,
}

/// CudaGraph holds raw driver handles; the executor owning it is driven by one thread at a
/// time (it is Send, not Sync), the same contract as [`crate::Gpu`].
struct Wrapped(DecodeGraph);
// SAFETY: see above; the graph's context is bound before every launch.
unsafe impl Send for Wrapped {}

impl Graphs {
    pub fn new() -> Self {
        Self {
            enabled: std::env::var("MLASERVE_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            map: HashMap::new(),
            refused: HashSet::new(),
        }
    }

    pub fn refused(&self, k: &GraphKey) -> bool {
        self.refused.contains(k)
    }

    pub fn refuse(&mut self, k: GraphKey) {
        self.refused.insert(k);
    }

    /// Takes the graph of `k` out (put it back with [`Graphs::put`]).
    pub fn take(&mut self, k: &GraphKey) -> Option<DecodeGraph> {
        self.map.remove(k).map(|w| w.0)
    }

    /// Keeps `g`; past [`MAX_GRAPHS`] shapes, `k` is refused instead (it runs eagerly rather
    /// than being captured again at every step).
    pub fn put(&mut self, k: GraphKey, g: DecodeGraph) {
        if self.map.len() < MAX_GRAPHS {
            self.map.insert(k, Wrapped(g));
        } else {
            self.refused.insert(k);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.refused.clear();
    }
}
