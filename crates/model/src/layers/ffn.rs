//! Feed-forward: dense SwiGLU and mixture-of-experts with DeepSeek/GLM routing.
//!
//! Routing (router logits in f32):
//! - softmax (DeepSeek-V2): p = softmax(logits); with groups, a group scores its max p, the top
//!   `topk_group` groups are kept; top-k over kept experts; weight = p[idx].
//! - sigmoid `noaux_tc` (DeepSeek-V3, GLM-5): s = sigmoid(logits); choice = s + correction_bias;
//!   a group scores the sum of its top-2 choice values; top-k by choice over kept groups;
//!   weight = s[idx] — the UNBIASED score: the bias only selects.
//!
//! Then `norm_topk_prob` renormalizes (sum + 1e-20) and every weight is multiplied by
//! `routed_scaling_factor`; shared experts are added unscaled. Ties go to the lower index.
//!
//! On a tensor-parallel rank the weights are slices (see `parallel::shard`): every rank routes
//! every token the same way, computes its slice (or, expert-parallel, its experts) and returns
//! a partial `[T, H]`; the caller sums the ranks' partials.

use crate::config::{Gating, MoeConfig};
use crate::probe::{probe, PathTag};
use crate::weights::{Mlp, Moe};
use mlaserve_backend::{matmul, matmul_batch, silu_mul, MatmulJob};

/// SwiGLU over x [T, H] -> [T, H].
pub fn mlp_forward(m: &Mlp, x: &[f32], t: usize) -> Vec<f32> {
    let f = m.gate.rows;
    let mut g = vec![0f32; t * f];
    let mut u = vec![0f32; t * f];
    matmul_batch(&mut [
        MatmulJob {
            x,
            n_tokens: t,
            w: &m.gate,
            out: &mut g,
        },
        MatmulJob {
            x,
            n_tokens: t,
            w: &m.up,
            out: &mut u,
        },
    ]);
    silu_mul(&mut g, &u);
    let mut out = vec![0f32; t * m.down.rows];
    matmul(&g, t, &m.down, &mut out);
    out
}

fn ranked(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Experts and weights for one token's router logits [E].
pub fn route(cfg: &MoeConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<usize>, Vec<f32>) {
    let e = logits.len();
    let per_group = e / cfg.n_group;
    let (scores, mut choice): (Vec<f32>, Vec<f32>) = match cfg.gating {
        Gating::Softmax => {
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = logits.iter().map(|&x| (x - m).exp()).collect();
            let sum: f32 = ex.iter().sum();
            let p: Vec<f32> = ex.iter().map(|&x| x / sum).collect();
            (p.clone(), p)
        }
        Gating::Sigmoid => {
            let s: Vec<f32> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
            let c = match bias {
                Some(b) => s.iter().zip(b).map(|(x, y)| x + y).collect(),
                None => s.clone(),
            };
            (s, c)
        }
    };
    if cfg.n_group > 1 && cfg.topk_group < cfg.n_group {
        let group_score: Vec<f32> = (0..cfg.n_group)
            .map(|g| {
                let grp = &choice[g * per_group..(g + 1) * per_group];
                match cfg.gating {
                    Gating::Softmax => grp.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    Gating::Sigmoid => ranked(grp, 2).iter().map(|&i| grp[i]).sum(),
                }
            })
            .collect();
        let keep = ranked(&group_score, cfg.topk_group);
        for g in 0..cfg.n_group {
            if !keep.contains(&g) {
                choice[g * per_group..(g + 1) * per_group].fill(f32::NEG_INFINITY);
            }
        }
    }
    let idx = ranked(&choice, cfg.top_k);
    let mut w: Vec<f32> = idx.iter().map(|&i| scores[i]).collect();
    if cfg.norm_topk_prob {
        let sum: f32 = w.iter().sum::<f32>() + 1e-20;
        for x in &mut w {
            *x /= sum;
        }
    }
    for x in &mut w {
        *x *= cfg.routed_scaling_factor;
    }
    (idx, w)
}

/// MoE over x [T, H] -> [T, H].
///
/// Three grouped products (see [`matmul_batch`]): the router with the shared experts'
/// gate/up, every routed expert's gate/up over its tokens, then every down. The outputs are
/// added as one expert after another, in expert order, then the shared experts.
pub fn moe_forward(cfg: &MoeConfig, layer: usize, m: &Moe, x: &[f32], t: usize) -> Vec<f32> {
    let h = m.router.cols;
    let e = m.router.rows;
    let mut logits = vec![0f32; t * e];
    // Shared experts' gate/up, [T, Fs] each.
    let fs = m.shared.as_ref().map_or(0, |sh| sh.gate.rows);
    let (mut sg, mut su) = (vec![0f32; t * fs], vec![0f32; t * fs]);
    {
        let mut jobs = vec![MatmulJob {
            x,
            n_tokens: t,
            w: &m.router,
            out: &mut logits,
        }];
        if let Some(sh) = &m.shared {
            jobs.push(MatmulJob {
                x,
                n_tokens: t,
                w: &sh.gate,
                out: &mut sg,
            });
            jobs.push(MatmulJob {
                x,
                n_tokens: t,
                w: &sh.up,
                out: &mut su,
            });
        }
        matmul_batch(&mut jobs);
    }
    // Per expert: (token, weight).
    let mut assign: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    let mut topk_flat = Vec::with_capacity(t * cfg.top_k * 2);
    for ti in 0..t {
        let (idx, w) = route(
            cfg,
            &logits[ti * e..(ti + 1) * e],
            m.correction_bias.as_deref(),
        );
        for (&i, &wi) in idx.iter().zip(&w) {
            assign[i].push((ti, wi));
            topk_flat.push(i as f32);
        }
        topk_flat.extend_from_slice(&w);
    }
    probe(
        Some(layer),
        "moe.router_topk",
        PathTag::None,
        &[t, 2 * cfg.top_k],
        &topk_flat,
    );
    // Only the experts held here (all of them unless expert-parallel) that have tokens.
    let mine = m.first_expert..m.first_expert + m.experts.len();
    let active: Vec<usize> = (0..e)
        .filter(|ei| !assign[*ei].is_empty() && mine.contains(ei))
        .collect();
    let xs: Vec<Vec<f32>> = active
        .iter()
        .map(|&ei| {
            assign[ei]
                .iter()
                .flat_map(|&(ti, _)| x[ti * h..(ti + 1) * h].iter().copied())
                .collect()
        })
        .collect();
    // gate / up [n_e, F] per active expert.
    let mut gs: Vec<Vec<f32>> = Vec::with_capacity(active.len());
    let mut us: Vec<Vec<f32>> = Vec::with_capacity(active.len());
    for &ei in &active {
        let len = assign[ei].len() * m.experts[ei - m.first_expert].gate.rows;
        gs.push(vec![0f32; len]);
        us.push(vec![0f32; len]);
    }
    {
        let mut jobs = Vec::with_capacity(2 * active.len());
        for (((&ei, xe), g), u) in active.iter().zip(&xs).zip(&mut gs).zip(&mut us) {
            let ex = &m.experts[ei - m.first_expert];
            let n = assign[ei].len();
            jobs.push(MatmulJob {
                x: xe,
                n_tokens: n,
                w: &ex.gate,
                out: g,
            });
            jobs.push(MatmulJob {
                x: xe,
                n_tokens: n,
                w: &ex.up,
                out: u,
            });
        }
        matmul_batch(&mut jobs);
    }
    for (g, u) in gs.iter_mut().zip(&us) {
        silu_mul(g, u);
    }
    silu_mul(&mut sg, &su);
    // down: [n_e, H] per active expert, [T, H] for the shared experts.
    let mut ys: Vec<Vec<f32>> = active
        .iter()
        .map(|&ei| vec![0f32; assign[ei].len() * h])
        .collect();
    let mut y_shared = vec![0f32; if m.shared.is_some() { t * h } else { 0 }];
    {
        let mut jobs = Vec::with_capacity(active.len() + 1);
        for ((&ei, g), y) in active.iter().zip(&gs).zip(&mut ys) {
            jobs.push(MatmulJob {
                x: g,
                n_tokens: assign[ei].len(),
                w: &m.experts[ei - m.first_expert].down,
                out: y,
            });
        }
        if let Some(sh) = &m.shared {
            jobs.push(MatmulJob {
                x: &sg,
                n_tokens: t,
                w: &sh.down,
                out: &mut y_shared,
            });
        }
        matmul_batch(&mut jobs);
    }
    let mut out = vec![0f32; t * h];
    for (&ei, ye) in active.iter().zip(&ys) {
        for (k, &(ti, wi)) in assign[ei].iter().enumerate() {
            for (o, &y) in out[ti * h..(ti + 1) * h]
                .iter_mut()
                .zip(&ye[k * h..(k + 1) * h])
            {
                *o += wi * y;
            }
        }
    }
    if m.shared.is_some() {
        for (o, y) in out.iter_mut().zip(y_shared) {
            *o += y;
        }
    }
    probe(Some(layer), "moe.out", PathTag::None, &[t, h], &out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(gating: Gating, n_group: usize, topk_group: usize, norm: bool) -> MoeConfig {
        MoeConfig {
            num_experts: 8,
            top_k: 2,
            num_shared_experts: 1,
            moe_intermediate_size: 4,
            n_group,
            topk_group,
            routed_scaling_factor: 2.5,
            norm_topk_prob: norm,
            gating,
            has_correction_bias: true,
        }
    }

    #[test]
    fn bias_selects_but_does_not_weight() {
        let logits = [0.0, 1.0, 2.0, 0.5, -1.0, 0.2, 0.1, 0.3];
        let mut bias = [0.0f32; 8];
        bias[0] = 5.0; // forces expert 0 in, with its unbiased weight sigmoid(0)=0.5
        let (idx, w) = route(&cfg(Gating::Sigmoid, 1, 1, false), &logits, Some(&bias));
        assert_eq!(idx, vec![0, 2]);
        assert!((w[0] - 0.5 * 2.5).abs() < 1e-6);
        assert!((w[1] - 2.5 / (1.0 + (-2f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn norm_then_scale() {
        let logits = [0.0, 1.0, 2.0, 0.5, -1.0, 0.2, 0.1, 0.3];
        let (_, w) = route(&cfg(Gating::Sigmoid, 1, 1, true), &logits, None);
        assert!((w.iter().sum::<f32>() - 2.5).abs() < 1e-5);
    }

    #[test]
    fn groups_limit_choice() {
        // 4 groups of 2; sigmoid groups score top-2 sums. Group 3 (experts 6,7) wins alone.
        let logits = [3.0, -5.0, 2.9, -5.0, -5.0, -5.0, 2.0, 2.0];
        let (idx, _) = route(&cfg(Gating::Sigmoid, 4, 1, true), &logits, None);
        assert_eq!(idx, vec![6, 7]);
        // softmax groups score their max: group 0 wins (expert 0), then expert 1 from the same group.
        let (idx, _) = route(&cfg(Gating::Softmax, 4, 1, false), &logits, None);
        assert_eq!(idx, vec![0, 1]);
    }
}
