//! Multi-head Latent Attention: projections, RoPE, the latent-cache write, and three ways to attend.
//!
//! Shapes (per rank): T new tokens, N heads, P nope, R rope, V value, L kv_lora_rank.
//! On a tensor-parallel rank N is the rank's share of the heads (`MlaWeights::num_heads`): the
//! latent rows, the cache write and the DSA selection are computed whole on every rank, and
//! the returned `[T, H]` is the rank's partial `o_proj` sum over its heads.
//!
//! 1. Unabsorbed ("MHA", prefill without cached context): `k_nope, v = kv_b(kv_c)` for every
//!    key; causal attention with q = [q_nope | q_pe], k = [k_nope | k_pe] (P+R wide).
//! 2. Absorbed ("MQA", decode): `q_lat = W_UK_h · q_nope` (P -> L); scores over the 576-wide
//!    cache rows `[kv_c | k_pe]`; `o_lat = sum p * kv_c`; `out = W_UV_h · o_lat` (L -> V).
//! 3. Context ("chunked prefill"): new tokens attend causally to themselves (unabsorbed) and
//!    non-causally to the cached context (decompressed from the cache), merged by LSE.
//!
//! All three use `ModelConfig::softmax_scale()` = (P+R)^-0.5 · mscale². The cache write happens
//! before attention, so a token always sees its own row (a 1-token prompt is valid on any path).
//! With a DSA indexer, each query attends only to its selected keys (all of them while the
//! context is <= index_topk).

use super::attention::{attend, attend_causal, merge};
use super::dsa;
use super::rope::Rope;
use crate::config::ModelConfig;
use crate::forward_batch::ForwardBatch;
use crate::kv_cache::LatentCache;
use crate::probe::{probe, PathTag};
use crate::weights::{IndexerWeights, MlaWeights};
use mlaserve_backend::team::par_map;
use mlaserve_backend::{matmul, matmul_batch, rms_norm, MatmulJob, QMatrix};

/// Slot of position `pos` of sequence `s`.
#[inline]
fn slot(batch: &ForwardBatch, s: usize, pos: usize) -> usize {
    let bs = batch.block_size;
    batch.seqs[s].block_table[pos / bs] as usize * bs + pos % bs
}

/// One MLA layer over the batch: returns [T, H] (after o_proj; a partial sum over this rank's
/// heads when sharded).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    cfg: &ModelConfig,
    layer: usize,
    w: &MlaWeights,
    indexer: Option<&IndexerWeights>,
    rope: &Rope,
    h: &[f32],
    batch: &ForwardBatch,
    cache: &mut LatentCache,
) -> Vec<f32> {
    let t = batch.num_tokens();
    // Heads held here: all N, or this tensor-parallel rank's share.
    let (n, p, r, v, l) = (
        w.num_heads,
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim,
        cfg.kv_lora_rank,
    );
    let qk = p + r;
    let eps = cfg.rms_norm_eps;

    // q: [T, N*(P+R)], per head [nope | rope]; q_c: [T, Lq] (the indexer reads it too).
    // kv: [T, L+R] = [kv_c | k_pe], from h in one grouped product with q_a (or q_b).
    let mut q = vec![0f32; t * n * qk];
    let mut kv = vec![0f32; t * (l + r)];
    let kv_job = |out| MatmulJob {
        x: h,
        n_tokens: t,
        w: &w.kv_a,
        out,
    };
    let q_c = match (&w.q_a, &w.q_a_norm) {
        (Some(q_a), Some(norm)) => {
            let lq = q_a.rows;
            let mut qc = vec![0f32; t * lq];
            matmul_batch(&mut [
                MatmulJob {
                    x: h,
                    n_tokens: t,
                    w: q_a,
                    out: &mut qc,
                },
                kv_job(&mut kv),
            ]);
            rms_norm(&mut qc, lq, norm, eps);
            matmul(&qc, t, &w.q_b, &mut q);
            Some(qc)
        }
        _ => {
            matmul_batch(&mut [
                MatmulJob {
                    x: h,
                    n_tokens: t,
                    w: &w.q_b,
                    out: &mut q,
                },
                kv_job(&mut kv),
            ]);
            None
        }
    };
    for ti in 0..t {
        let row = &mut kv[ti * (l + r)..(ti + 1) * (l + r)];
        rms_norm(&mut row[..l], l, &w.kv_a_norm, eps);
        let (cos, sin) = rope.cos_sin(batch.positions[ti]);
        Rope::apply(&mut row[l..], &cos, &sin);
        for hd in 0..n {
            let o = ti * n * qk + hd * qk + p;
            Rope::apply(&mut q[o..o + r], &cos, &sin);
        }
    }
    if crate::probe::active() {
        let gather = |off: usize, len: usize| -> Vec<f32> {
            (0..t * n)
                .flat_map(|i| q[i * qk + off..i * qk + off + len].iter().copied())
                .collect()
        };
        probe(
            Some(layer),
            "mla.q_nope",
            PathTag::None,
            &[t, n, p],
            &gather(0, p),
        );
        probe(
            Some(layer),
            "mla.q_pe",
            PathTag::None,
            &[t, n, r],
            &gather(p, r),
        );
        let kvc: Vec<f32> = (0..t)
            .flat_map(|i| kv[i * (l + r)..i * (l + r) + l].iter().copied())
            .collect();
        let kpe: Vec<f32> = (0..t)
            .flat_map(|i| kv[i * (l + r) + l..(i + 1) * (l + r)].iter().copied())
            .collect();
        probe(Some(layer), "mla.kv_c_normed", PathTag::None, &[t, l], &kvc);
        probe(Some(layer), "mla.k_pe", PathTag::None, &[t, r], &kpe);
    }
    // Cache write precedes attention.
    for ti in 0..t {
        cache
            .row_mut(layer, batch.slot_mapping[ti])
            .copy_from_slice(&kv[ti * (l + r)..(ti + 1) * (l + r)]);
    }
    // Keys each token may attend to (None: all positions <= its own).
    let selected: Vec<Option<Vec<usize>>> = match (indexer, &cfg.indexer, &q_c) {
        (Some(iw), Some(ic), Some(qc)) => {
            dsa::select(cfg, ic, layer, iw, rope, h, qc, batch, cache)
        }
        _ => vec![None; t],
    };
    let cache = &*cache;
    let scale = cfg.softmax_scale();
    let mut o = vec![0f32; t * n * v];
    let mut path_tag = PathTag::None;
    for s in 0..batch.seqs.len() {
        let (a, b) = (batch.seq_starts[s], batch.seq_starts[s + 1]);
        let ctx = batch.seqs[s].context_len;
        let qlen = b - a;
        // Key positions of each query, ascending; built once per sequence, shared by all heads.
        let keys_all: Vec<Vec<usize>> = (0..qlen)
            .map(|i| match &selected[a + i] {
                Some(sel) => sel.clone(),
                None => (0..=ctx + i).collect(),
            })
            .collect();
        let per_head: Vec<Vec<f32>> = if batch.is_decode[a] {
            path_tag = PathTag::Mqa;
            // Absorbed: q_lat [qlen, L] per head (one grouped product over the heads);
            // attend over latent rows.
            let w_uk_t: Vec<QMatrix> = (0..n).map(|hd| w.w_uk_t.rows_slice(hd * l, l)).collect();
            let w_uv: Vec<QMatrix> = (0..n).map(|hd| w.w_uv.rows_slice(hd * v, v)).collect();
            let q_nope: Vec<Vec<f32>> = (0..n)
                .map(|hd| {
                    (0..qlen)
                        .flat_map(|i| q[(a + i) * n * qk + hd * qk..][..p].iter().copied())
                        .collect()
                })
                .collect();
            let mut q_lat_all: Vec<Vec<f32>> = vec![vec![0f32; qlen * l]; n];
            matmul_batch(
                &mut q_nope
                    .iter()
                    .zip(&w_uk_t)
                    .zip(&mut q_lat_all)
                    .map(|((x, w), out)| MatmulJob {
                        x,
                        n_tokens: qlen,
                        w,
                        out,
                    })
                    .collect::<Vec<_>>(),
            );
            if crate::probe::active() {
                let flat: Vec<f32> = (0..qlen)
                    .flat_map(|i| (0..n).flat_map(move |hd| (0..l).map(move |x| (hd, i, x))))
                    .map(|(hd, i, x)| q_lat_all[hd][i * l + x])
                    .collect();
                probe(Some(layer), "mla.q_lat", PathTag::Mqa, &[qlen, n, l], &flat);
            }
            let rows: Vec<&[f32]> = (0..ctx + qlen)
                .map(|pos| cache.row(layer, slot(batch, s, pos)))
                .collect();
            let o_lat: Vec<Vec<f32>> = par_map(n, |hd| {
                let mut scores = Vec::new();
                let mut o_lat = vec![0f32; qlen * l];
                for i in 0..qlen {
                    let qp = &q[(a + i) * n * qk + hd * qk + p..][..r];
                    attend(
                        &keys_all[i],
                        |j| (&rows[j][..l], &rows[j][l..], &rows[j][..l]),
                        &q_lat_all[hd][i * l..(i + 1) * l],
                        qp,
                        scale,
                        &mut scores,
                        &mut o_lat[i * l..(i + 1) * l],
                    );
                }
                o_lat
            });
            // out_h = W_UV_h · o_lat_h, one grouped product over the heads.
            let mut outs: Vec<Vec<f32>> = vec![vec![0f32; qlen * v]; n];
            matmul_batch(
                &mut o_lat
                    .iter()
                    .zip(&w_uv)
                    .zip(&mut outs)
                    .map(|((x, w), out)| MatmulJob {
                        x,
                        n_tokens: qlen,
                        w,
                        out,
                    })
                    .collect::<Vec<_>>(),
            );
            outs
        } else {
            path_tag = if ctx > 0 {
                PathTag::Context
            } else {
                PathTag::Mha
            };
            // Unabsorbed: decompress every key position 0..ctx+qlen from the cache.
            let total = ctx + qlen;
            let mut kvc = vec![0f32; total * l];
            let mut kpe = vec![0f32; total * r];
            for pos in 0..total {
                let row = cache.row(layer, slot(batch, s, pos));
                kvc[pos * l..(pos + 1) * l].copy_from_slice(&row[..l]);
                kpe[pos * r..(pos + 1) * r].copy_from_slice(&row[l..]);
            }
            // A prompt without context whose queries see every earlier key: the blocked
            // causal kernel (the same arithmetic as `attend`, value loads shared).
            let causal_prompt = ctx == 0 && selected[a..b].iter().all(|s| s.is_none());
            let mut k_nope = vec![0f32; total * n * p];
            let mut vals = vec![0f32; total * n * v];
            matmul_batch(&mut [
                MatmulJob {
                    x: &kvc,
                    n_tokens: total,
                    w: &w.w_uk,
                    out: &mut k_nope,
                },
                MatmulJob {
                    x: &kvc,
                    n_tokens: total,
                    w: &w.w_uv,
                    out: &mut vals,
                },
            ]);
            par_map(n, |hd| {
                let key = |j: usize| {
                    (
                        &k_nope[(j * n + hd) * p..(j * n + hd + 1) * p],
                        &kpe[j * r..(j + 1) * r],
                        &vals[(j * n + hd) * v..(j * n + hd + 1) * v],
                    )
                };
                let mut out = vec![0f32; qlen * v];
                if causal_prompt {
                    attend_causal(
                        qlen,
                        |j| (&k_nope[(j * n + hd) * p..][..p], &kpe[j * r..][..r]),
                        |i| q[(a + i) * n * qk + hd * qk..][..qk].split_at(p),
                        scale,
                        &vals,
                        hd * v,
                        n * v,
                        v,
                        &mut out,
                    );
                    return out;
                }
                let mut scores = Vec::new();
                let mut part = vec![0f32; v];
                for i in 0..qlen {
                    let qrow = &q[(a + i) * n * qk + hd * qk..][..qk];
                    let (qn, qp) = qrow.split_at(p);
                    let keys = &keys_all[i];
                    let oi = &mut out[i * v..(i + 1) * v];
                    if ctx == 0 {
                        attend(keys, key, qn, qp, scale, &mut scores, oi);
                    } else {
                        // Context part (non-causal over cached positions) + new part (causal);
                        // keys are ascending, so the split is one binary search.
                        let (old, new) = keys.split_at(keys.partition_point(|&j| j < ctx));
                        let lse_old = attend(old, key, qn, qp, scale, &mut scores, oi);
                        let lse_new = attend(new, key, qn, qp, scale, &mut scores, &mut part);
                        merge(oi, lse_old, &part, lse_new);
                    }
                }
                out
            })
        };
        for (hd, out) in per_head.iter().enumerate() {
            for i in 0..qlen {
                o[((a + i) * n + hd) * v..((a + i) * n + hd + 1) * v]
                    .copy_from_slice(&out[i * v..(i + 1) * v]);
            }
        }
    }
    probe(Some(layer), "mla.attn_out", path_tag, &[t, n, v], &o);
    let mut out = vec![0f32; t * cfg.hidden_size];
    matmul(&o, t, &w.o_proj, &mut out);
    probe(
        Some(layer),
        "mla.o_proj",
        path_tag,
        &[t, cfg.hidden_size],
        &out,
    );
    out
}
