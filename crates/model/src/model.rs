//! `Model`: load once, then run batches.
//!
//! Invariants: the config is validated before any weight is read; `forward` checks the batch
//! against the cache (slots in range, token ids < vocab) before touching it, so a bad batch is
//! an error and never a panic or a silent write out of bounds.
//!
//! Tensor parallelism: a model loaded with `LoadOptions::shard` holds one rank's slice and runs
//! only through [`Model::forward_sharded`], which sums the ranks' partial `[T, H]` outputs of
//! attention (after `o_proj`) and of the FFN through the communicator before each residual
//! add; the residual stream is then identical on every rank. Only rank 0 computes logits.

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward_batch::{AttentionPath, ForwardBatch};
use crate::kv_cache::LatentCache;
use crate::layers::ffn::{mlp_forward, moe_forward};
use crate::layers::mla;
use crate::layers::rope::Rope;
use crate::parallel::{Communicator, Shard};
use crate::probe::{self, probe, PathTag};
use crate::source::{HfDir, Source};
use crate::weights::{Ffn, Weights};
use mlaserve_backend::{matmul, rms_norm};
use mlaserve_gguf::GgufFile;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Default attention path for callers that do not choose per batch.
    pub attention_path: AttentionPath,
    /// Dequantize every weight matrix to f32 at load (exact arithmetic; no activation
    /// quantization). For checking a quantized file's layout against a dequantized reference.
    pub dequantize: bool,
    /// Load one tensor-parallel rank's slice (None: the whole model).
    pub shard: Option<Shard>,
}

/// A loaded model.
pub struct Model {
    config: ModelConfig,
    source: Source,
    path: PathBuf,
    weights: Weights,
    rope: Rope,
    options: LoadOptions,
}

impl Model {
    /// Load a `.gguf` file or an HF directory (config.json + *.safetensors).
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Model, ModelError> {
        let (config, source) = if path.is_dir() {
            let dir = HfDir::open(path)?;
            let cfg = ModelConfig::from_hf_json(
                &dir.config_json,
                &path.join("config.json").display().to_string(),
            )?;
            (cfg, Source::Hf(dir))
        } else {
            let file = GgufFile::open(path)?;
            let cfg = ModelConfig::from_gguf(&file)?;
            (cfg, Source::Gguf(Arc::new(file)))
        };
        let weights = Weights::load_shard(&source, &config, options.dequantize, options.shard)?;
        let rope = Rope::new(
            config.qk_rope_head_dim,
            config.rope_theta,
            config.yarn.as_ref(),
        );
        Ok(Model {
            config,
            source,
            path: path.to_path_buf(),
            weights,
            rope,
            options: options.clone(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The GGUF file, when loaded from one (tokenizer metadata lives there).
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.source {
            Source::Gguf(f) => Some(f),
            Source::Hf(_) => None,
        }
    }

    /// The loaded weights (doctor reads W_UV to judge attention-output norms).
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    pub fn source_path(&self) -> &Path {
        &self.path
    }

    pub fn options(&self) -> &LoadOptions {
        &self.options
    }

    /// The tensor-parallel slice held (None: the whole model).
    pub fn shard(&self) -> Option<Shard> {
        self.options.shard
    }

    fn check(&self, batch: &ForwardBatch, cache: &LatentCache) -> Result<(), ModelError> {
        batch.check_against(
            cache.num_blocks(),
            cache.block_size(),
            self.config.vocab_size,
        )?;
        if let Some(&p) = batch.positions.iter().max() {
            if p >= self.config.context_length.max(1) * 4 {
                tracing::warn!(
                    position = p,
                    context = self.config.context_length,
                    "position far past the trained context"
                );
            }
        }
        Ok(())
    }

    /// Run one step: write the new tokens' latent rows into `cache`, attend, and return logits
    /// [batch.logits_indices().len(), vocab_size] row-major. A model holding a slice of a
    /// tensor-parallel group cannot run alone: that is an error (use `forward_sharded`).
    pub fn forward(
        &self,
        batch: &ForwardBatch,
        cache: &mut LatentCache,
    ) -> Result<Vec<f32>, ModelError> {
        if let Some(s) = self.shard().filter(|s| s.world_size > 1) {
            return Err(ModelError::Batch(format!(
                "this model holds rank {} of {}: run it through forward_sharded with its communicator",
                s.rank, s.world_size
            )));
        }
        // The step runs on a rayon worker leading a team: the other workers spin for its
        // products and attention heads instead of sleeping between them (`team`); a leader
        // outside the pool measured no gain. This thread's probe state goes with it.
        use crate::probe::{swap_thread_state, take_thread_state};
        use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
        let state = take_thread_state();
        let (out, state) = rayon::scope(|_| {
            // Swap, not overwrite: this worker may be waiting in a join of another forward.
            let outer = swap_thread_state(state);
            let out = catch_unwind(AssertUnwindSafe(|| {
                mlaserve_backend::team::run(|| self.forward_inner(batch, cache, None))
            }));
            (out, swap_thread_state(outer))
        });
        swap_thread_state(state);
        out.unwrap_or_else(|p| resume_unwind(p))
    }

    /// One rank's share of a step: like [`Model::forward`], with the partial outputs of
    /// attention and FFN summed over the ranks of `comm`. Every rank must call it with the same
    /// batch (and a cache holding the same rows). Rank 0 returns the logits; the other ranks
    /// return an empty vector.
    pub fn forward_sharded(
        &self,
        batch: &ForwardBatch,
        cache: &mut LatentCache,
        comm: &dyn Communicator,
    ) -> Result<Vec<f32>, ModelError> {
        let (rank, world) = self.shard().map_or((0, 1), |s| (s.rank, s.world_size));
        if comm.rank() != rank || comm.world_size() != world {
            return Err(ModelError::Batch(format!(
                "model holds rank {rank} of {world}, communicator is rank {} of {}",
                comm.rank(),
                comm.world_size()
            )));
        }
        self.forward_inner(batch, cache, Some(comm))
    }

    fn forward_inner(
        &self,
        batch: &ForwardBatch,
        cache: &mut LatentCache,
        comm: Option<&dyn Communicator>,
    ) -> Result<Vec<f32>, ModelError> {
        self.check(batch, cache)?;
        let cfg = &self.config;
        let (t, hsz) = (batch.num_tokens(), cfg.hidden_size);
        probe::begin_step(&batch.positions);
        // x: [T, H] residual stream.
        let mut x = vec![0f32; t * hsz];
        for (i, &tok) in batch.tokens.iter().enumerate() {
            self.weights
                .embed
                .dequantize_row(tok as usize, &mut x[i * hsz..(i + 1) * hsz]);
        }
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let mut hn = x.clone();
            rms_norm(&mut hn, hsz, &layer.attn_norm, cfg.rms_norm_eps);
            probe(Some(li), "attn_norm", PathTag::None, &[t, hsz], &hn);
            let mut attn = mla::forward(
                cfg,
                li,
                &layer.mla,
                layer.indexer.as_ref(),
                &self.rope,
                &hn,
                batch,
                cache,
            );
            if let Some(c) = comm {
                c.all_reduce_sum(&mut attn)?;
            }
            for (a, b) in x.iter_mut().zip(&attn) {
                *a += b;
            }
            let mut hn = x.clone();
            rms_norm(&mut hn, hsz, &layer.ffn_norm, cfg.rms_norm_eps);
            let mut ffn = match (&layer.ffn, &cfg.moe) {
                (Ffn::Moe(m), Some(mc)) => moe_forward(mc, li, m, &hn, t),
                (Ffn::Dense(m), _) => {
                    let out = mlp_forward(m, &hn, t);
                    probe(Some(li), "mlp.out", PathTag::None, &[t, hsz], &out);
                    out
                }
                (Ffn::Moe(_), None) => {
                    unreachable!("MoE weights are only loaded with a MoE config")
                }
            };
            if let Some(c) = comm {
                c.all_reduce_sum(&mut ffn)?;
            }
            for (a, b) in x.iter_mut().zip(&ffn) {
                *a += b;
            }
            probe(Some(li), "out", PathTag::None, &[t, hsz], &x);
        }
        if comm.is_some_and(|c| c.rank() != 0) {
            // Logits are rank 0's job; the residual stream here is identical to its.
            probe::end_step().map_err(|e| ModelError::Io {
                path: PathBuf::from("--dump"),
                msg: e.to_string(),
            })?;
            return Ok(Vec::new());
        }
        let idx = batch.logits_indices();
        let mut last: Vec<f32> = idx
            .iter()
            .flat_map(|&i| x[i * hsz..(i + 1) * hsz].iter().copied())
            .collect();
        rms_norm(&mut last, hsz, &self.weights.output_norm, cfg.rms_norm_eps);
        let mut logits = vec![0f32; idx.len() * cfg.vocab_size];
        matmul(&last, idx.len(), &self.weights.lm_head, &mut logits);
        probe(
            None,
            "logits",
            PathTag::None,
            &[idx.len(), cfg.vocab_size],
            &logits,
        );
        probe::end_step().map_err(|e| ModelError::Io {
            path: PathBuf::from("--dump"),
            msg: e.to_string(),
        })?;
        Ok(logits)
    }
}
