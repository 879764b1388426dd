//! The paged latent cache: per layer, one row per token of `[kv_c_normed (L) | k_pe (R)]`.
//!
//! Invariants: a slot `s` = `block * block_size + offset` addresses row `s` of every layer;
//! rows hold `kv_c` AFTER `kv_a_layernorm` and `k_pe` AFTER RoPE; there is no V cache (V is
//! the first L columns of the same row). GLM-5 models also keep one DSA indexer key per token
//! per layer (`index_head_dim` wide, after LayerNorm and RoPE). Rows are f32 on CPU. The
//! engine's block manager decides which blocks a sequence owns; this type only stores rows.

use crate::config::ModelConfig;

/// Latent rows (and DSA indexer keys) for `num_blocks * block_size` slots per layer.
#[derive(Debug, Clone)]
pub struct LatentCache {
    num_blocks: usize,
    block_size: usize,
    latent_dim: usize,
    index_dim: usize,
    /// [layer][slot * latent_dim]
    latent: Vec<Vec<f32>>,
    /// [layer][slot * index_dim] (empty without an indexer)
    index_keys: Vec<Vec<f32>>,
}

impl LatentCache {
    /// A zeroed cache for `config`.
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Self {
        let slots = num_blocks * block_size;
        let latent_dim = config.latent_dim();
        let index_dim = config.indexer.as_ref().map_or(0, |ix| ix.head_dim);
        LatentCache {
            num_blocks,
            block_size,
            latent_dim,
            index_dim,
            latent: (0..config.num_layers)
                .map(|_| vec![0.0; slots * latent_dim])
                .collect(),
            index_keys: (0..config.num_layers)
                .map(|_| vec![0.0; slots * index_dim])
                .collect(),
        }
    }

    /// Bytes one block takes across all layers.
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        let index_dim = config.indexer.as_ref().map_or(0, |ix| ix.head_dim);
        config.num_layers
            * block_size
            * (config.latent_dim() + index_dim)
            * std::mem::size_of::<f32>()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of addressable slots.
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// The latent row at `slot` of `layer`: [L + R].
    #[inline]
    pub fn row(&self, layer: usize, slot: usize) -> &[f32] {
        &self.latent[layer][slot * self.latent_dim..(slot + 1) * self.latent_dim]
    }

    /// Mutable latent row.
    #[inline]
    pub fn row_mut(&mut self, layer: usize, slot: usize) -> &mut [f32] {
        &mut self.latent[layer][slot * self.latent_dim..(slot + 1) * self.latent_dim]
    }

    /// The DSA indexer key at `slot` of `layer`: [index_head_dim].
    #[inline]
    pub fn index_key(&self, layer: usize, slot: usize) -> &[f32] {
        &self.index_keys[layer][slot * self.index_dim..(slot + 1) * self.index_dim]
    }

    /// Mutable indexer key.
    #[inline]
    pub fn index_key_mut(&mut self, layer: usize, slot: usize) -> &mut [f32] {
        &mut self.index_keys[layer][slot * self.index_dim..(slot + 1) * self.index_dim]
    }

    /// Copy block `src` to block `dst` in every layer (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let (bs, ld, id) = (self.block_size, self.latent_dim, self.index_dim);
        for layer in &mut self.latent {
            layer.copy_within(
                src as usize * bs * ld..(src as usize + 1) * bs * ld,
                dst as usize * bs * ld,
            );
        }
        for layer in &mut self.index_keys {
            layer.copy_within(
                src as usize * bs * id..(src as usize + 1) * bs * id,
                dst as usize * bs * id,
            );
        }
    }
}
