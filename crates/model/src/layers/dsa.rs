//! GLM-5 DSA lightning indexer: which cached keys each query attends to.
//!
//! Per token (HF `GlmMoeDsaIndexer`, vLLM `Indexer`):
//! ```text
//! q = wq_b(q_c).view(Hi, D); q[..R] = rope(q[..R])        # rope dims FIRST, interleaved
//! k = LayerNorm(wk(x), eps 1e-6) [D];  k[..R] = rope(k[..R])   # one key per token (MQA), cached
//! w = weights_proj(x) * Hi^-0.5                            # [Hi]
//! score[s] = sum_h w[h] * relu(q[h]·k[s] * D^-0.5)        # s <= t (causal)
//! ```
//! A query at position t keeps the top `min(index_topk, t+1)` positions (ties to the lower
//! position). While `t + 1 <= index_topk` that is every position, so the result is `None`
//! (dense) and attention is exact. Keys come from the indexer cache, written here first.

use super::rope::Rope;
use crate::config::{IndexerConfig, ModelConfig};
use crate::forward_batch::ForwardBatch;
use crate::kv_cache::LatentCache;
use crate::probe::{probe, PathTag};
use crate::weights::IndexerWeights;
use mlaserve_backend::team::par_map;
use mlaserve_backend::{dot_f32, matmul};

fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, &wi), &bi) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * wi + bi;
    }
}

/// Top-`k` positions by score, ties to the lower position, returned in ascending order.
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

/// Compute, cache and score indexer keys; per token, the selected positions (None = all).
#[allow(clippy::too_many_arguments)]
pub fn select(
    cfg: &ModelConfig,
    ic: &IndexerConfig,
    layer: usize,
    w: &IndexerWeights,
    rope: &Rope,
    h: &[f32],
    q_c: &[f32],
    batch: &ForwardBatch,
    cache: &mut LatentCache,
) -> Vec<Option<Vec<usize>>> {
    let t = batch.num_tokens();
    let (hi, d, r) = (ic.num_heads, ic.head_dim, cfg.qk_rope_head_dim);
    let mut iq = vec![0f32; t * hi * d];
    matmul(q_c, t, &w.wq_b, &mut iq);
    let mut ik = vec![0f32; t * d];
    matmul(h, t, &w.wk, &mut ik);
    let mut wt = vec![0f32; t * hi];
    matmul(h, t, &w.proj, &mut wt);
    let head_scale = (hi as f32).powf(-0.5);
    for x in &mut wt {
        *x *= head_scale;
    }
    for ti in 0..t {
        let (cos, sin) = rope.cos_sin(batch.positions[ti]);
        let k = &mut ik[ti * d..(ti + 1) * d];
        layer_norm(k, &w.k_norm_w, &w.k_norm_b, 1e-6);
        Rope::apply(&mut k[..r], &cos, &sin);
        for hd in 0..hi {
            Rope::apply(&mut iq[(ti * hi + hd) * d..][..r], &cos, &sin);
        }
        cache
            .index_key_mut(layer, batch.slot_mapping[ti])
            .copy_from_slice(k);
    }
    let cache = &*cache;
    let d_scale = (d as f32).powf(-0.5);
    let bs = batch.block_size;
    let sel: Vec<Option<Vec<usize>>> = par_map(t, |ti| {
        let s = batch.seq_starts.partition_point(|&st| st <= ti) - 1;
        let pos = batch.positions[ti];
        if pos < ic.topk {
            return None;
        }
        let table = &batch.seqs[s].block_table;
        let scores: Vec<f32> = (0..=pos)
            .map(|j| {
                let key = cache.index_key(layer, table[j / bs] as usize * bs + j % bs);
                (0..hi)
                    .map(|hd| {
                        wt[ti * hi + hd]
                            * (dot_f32(&iq[(ti * hi + hd) * d..][..d], key) * d_scale).max(0.0)
                    })
                    .sum()
            })
            .collect();
        Some(top_k(&scores, ic.topk))
    });
    if crate::probe::active() {
        // [T, topk] selected positions (-1 pads dense rows past their length).
        let mut flat = vec![-1f32; t * ic.topk];
        for (ti, s) in sel.iter().enumerate() {
            let row: Vec<usize> = match s {
                Some(v) => v.clone(),
                None => (0..=batch.positions[ti]).take(ic.topk).collect(),
            };
            for (k, &pos) in row.iter().enumerate() {
                flat[ti * ic.topk + k] = pos as f32;
            }
        }
        probe(Some(layer), "dsa.topk", PathTag::None, &[t, ic.topk], &flat);
    }
    sel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_prefers_high_scores_then_low_positions() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.9, 0.0], 3), vec![1, 2, 3]);
        assert_eq!(top_k(&[0.0, 0.0, 0.0], 2), vec![0, 1]);
    }
}
