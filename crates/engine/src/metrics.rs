//! `EngineMetrics`: a snapshot of the engine's counters, published after every step.
//!
//! Gauges (`num_*` of now) and monotonically increasing counters (`*_total`, prefix-cache
//! queries/hits, preemptions). Token counters count tokens the engine produced or was given:
//! `prompt_tokens_total` adds a request's prompt length when its first token is sampled.

/// Where the time of one kind of step went, summed over the steps of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    pub steps: u64,
    /// Tokens computed (scheduled) by those steps.
    pub tokens: u64,
    /// In the model runner: the batch built, the forward pass, its logits (or argmaxes)
    /// on the host.
    pub forward_seconds: f64,
    /// The rest of the step on the engine thread: scheduling, sampling, detokenizing, stop
    /// checks, sending the tokens.
    pub host_seconds: f64,
}

/// Engine counters at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineMetrics {
    /// Sequences admitted (prefilling or decoding).
    pub num_running: usize,
    /// Sequences queued (new or preempted).
    pub num_waiting: usize,
    /// Cache blocks referenced by live sequences.
    pub num_cache_blocks_used: usize,
    pub num_cache_blocks_total: usize,
    /// Prompt tokens looked up in the prefix cache at admission.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found (and not recomputed).
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Requests that ended, by outcome.
    pub num_finished_stop: u64,
    pub num_finished_length: u64,
    pub num_aborted: u64,
    pub num_failed: u64,
    /// Engine steps that ran a forward pass.
    pub num_steps: u64,
    /// Steps whose every sequence computed one token past its prompt (a GPU replays these
    /// from CUDA graphs).
    pub decode_steps: StepTimes,
    /// Steps with at least one prompt chunk (prefill, possibly mixed with decodes; a prompt's
    /// one-token last chunk counts).
    pub prefill_steps: StepTimes,
}

impl EngineMetrics {
    /// Fraction of cache blocks in use, 0 to 1.
    pub fn cache_usage(&self) -> f64 {
        if self.num_cache_blocks_total == 0 {
            0.0
        } else {
            self.num_cache_blocks_used as f64 / self.num_cache_blocks_total as f64
        }
    }

    /// Fraction of looked-up prompt tokens served from the prefix cache.
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        if self.prefix_cache_queries == 0 {
            0.0
        } else {
            self.prefix_cache_hits as f64 / self.prefix_cache_queries as f64
        }
    }
}
