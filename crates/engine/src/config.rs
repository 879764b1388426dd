//! `EngineConfig`: the serving limits, validated once at `start_engine` against the model.
//!
//! Resolution: `num_blocks` = the given count, else `cache_memory_bytes / bytes_per_block`;
//! `max_model_len` = the given length (an error if above the model's context or above what
//! the cache holds), else the model's `context_length` capped to what the cache holds (with a
//! warning). So one sequence of `max_model_len` tokens always fits in the cache, which the
//! scheduler's preemption relies on for progress.

use mlaserve_model::{LatentCache, ModelConfig};

/// Engine limits. `Default` suits a CPU host: 64-token blocks, 2 GiB of latent cache,
/// prefix caching on.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Most sequences running (prefilling or decoding) at once.
    pub max_num_seqs: usize,
    /// Token budget of one step (decodes + prefill chunks); longer prompts are chunked.
    pub max_num_batched_tokens: usize,
    /// Token positions per cache block.
    pub block_size: usize,
    /// Cache blocks; `None`: derived from `cache_memory_bytes`.
    pub num_blocks: Option<usize>,
    /// Latent-cache memory budget used when `num_blocks` is `None`.
    pub cache_memory_bytes: usize,
    /// Longest sequence (prompt + output); `None`: the model's context, capped by the cache.
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// Most requests queued before admission; beyond it `add` returns `QueueFull`.
    pub max_waiting: usize,
    /// Seeds the streams of requests that carry no seed (`None`: from the clock).
    pub seed: Option<u64>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 128,
            max_num_batched_tokens: 2048,
            block_size: 64,
            num_blocks: None,
            cache_memory_bytes: 2 << 30,
            max_model_len: None,
            enable_prefix_caching: true,
            max_waiting: 1024,
            seed: None,
        }
    }
}

/// Sizes derived from an [`EngineConfig`] and a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedConfig {
    pub num_blocks: usize,
    pub max_model_len: usize,
}

impl EngineConfig {
    /// Checks the config against `model` and derives the cache size and context length.
    pub fn resolve(&self, model: &ModelConfig) -> Result<ResolvedConfig, String> {
        for (name, v) in [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
            ("max_waiting", self.max_waiting),
        ] {
            if v == 0 {
                return Err(format!("engine config: {name} must be at least 1"));
            }
        }
        let bytes_per_block = LatentCache::bytes_per_block(model, self.block_size);
        let num_blocks = match self.num_blocks {
            Some(0) => return Err("engine config: num_blocks must be at least 1".into()),
            Some(n) => n,
            None => self.cache_memory_bytes / bytes_per_block.max(1),
        };
        if num_blocks == 0 {
            return Err(format!(
                "engine config: cache_memory_bytes {} holds no block of {bytes_per_block} bytes",
                self.cache_memory_bytes
            ));
        }
        if num_blocks > u32::MAX as usize {
            return Err(format!(
                "engine config: {num_blocks} blocks exceed the u32 block ids"
            ));
        }
        let capacity = num_blocks * self.block_size;
        let max_model_len = match self.max_model_len {
            Some(0) => return Err("engine config: max_model_len must be at least 1".into()),
            Some(n) if n > model.context_length => {
                return Err(format!(
                    "engine config: max_model_len {n} exceeds the model's context length {}",
                    model.context_length
                ))
            }
            Some(n) if n > capacity => {
                return Err(format!(
                "engine config: max_model_len {n} exceeds the {capacity} tokens the cache holds \
                     ({num_blocks} blocks of {}); raise the cache size or lower max_model_len",
                self.block_size
            ))
            }
            Some(n) => n,
            None if model.context_length > capacity => {
                tracing::warn!(
                    context_length = model.context_length,
                    capacity,
                    "the latent cache holds fewer tokens than the model's context: max_model_len capped"
                );
                capacity
            }
            None => model.context_length,
        };
        Ok(ResolvedConfig {
            num_blocks,
            max_model_len,
        })
    }
}
