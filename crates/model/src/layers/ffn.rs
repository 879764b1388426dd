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

/// (token, expert) rows a MoE layer gathers and multiplies at once (see [`moe_forward`]):
/// 4,096 rows of DeepSeek-V3's widths (H 7,168, F 2,048) hold ~0.2 GB of gathered inputs and
/// intermediates; a decode step or a short prompt is one group.
const MOE_GROUP_ROWS: usize = 4096;

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
/// Grouped products (see [`matmul_batch`]): the router with the shared experts' gate/up,
/// then per group of routed experts (at most `MOE_GROUP_ROWS` token rows) their gate/up
/// over their tokens and their downs (the shared experts' down with the last group). The
/// outputs are added as one expert after another, in expert order, then the shared experts.
pub fn moe_forward(cfg: &MoeConfig, layer: usize, m: &Moe, x: &[f32], t: usize) -> Vec<f32> {
    moe_forward_in_groups(cfg, layer, m, x, t, MOE_GROUP_ROWS)
}

/// [`moe_forward`] with groups of at most `group_rows` (token, expert) rows (at least one
/// expert a group): the same outputs, bit for bit, for any `group_rows`.
fn moe_forward_in_groups(
    cfg: &MoeConfig,
    layer: usize,
    m: &Moe,
    x: &[f32],
    t: usize,
    group_rows: usize,
) -> Vec<f32> {
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
    // Only the experts held here (all of them unless expert-parallel) that have tokens, in
    // groups of at most `group_rows` (token, expert) rows (at least one expert), so a long
    // prompt holds one group's gathered rows and intermediates at a time.
    let mine = m.first_expert..m.first_expert + m.experts.len();
    let active: Vec<usize> = (0..e)
        .filter(|ei| !assign[*ei].is_empty() && mine.contains(ei))
        .collect();
    let mut groups: Vec<&[usize]> = Vec::new();
    let (mut g0, mut rows) = (0, 0);
    for (k, &ei) in active.iter().enumerate() {
        if rows > 0 && rows + assign[ei].len() > group_rows {
            groups.push(&active[g0..k]);
            (g0, rows) = (k, 0);
        }
        rows += assign[ei].len();
    }
    groups.push(&active[g0..]);
    let mut out = vec![0f32; t * h];
    let mut y_shared = vec![0f32; if m.shared.is_some() { t * h } else { 0 }];
    silu_mul(&mut sg, &su);
    let last = groups.len() - 1;
    for (gi, group) in groups.into_iter().enumerate() {
        let xs: Vec<Vec<f32>> = group
            .iter()
            .map(|&ei| {
                assign[ei]
                    .iter()
                    .flat_map(|&(ti, _)| x[ti * h..(ti + 1) * h].iter().copied())
                    .collect()
            })
            .collect();
        // gate / up [n_e, F] per expert of the group.
        let mut gs: Vec<Vec<f32>> = Vec::with_capacity(group.len());
        let mut us: Vec<Vec<f32>> = Vec::with_capacity(group.len());
        for &ei in group {
            let len = assign[ei].len() * m.experts[ei - m.first_expert].gate.rows;
            gs.push(vec![0f32; len]);
            us.push(vec![0f32; len]);
        }
        {
            let mut jobs = Vec::with_capacity(2 * group.len());
            for (((&ei, xe), g), u) in group.iter().zip(&xs).zip(&mut gs).zip(&mut us) {
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
        // down: [n_e, H] per expert of the group; the shared experts' [T, H] with the last.
        let mut ys: Vec<Vec<f32>> = group
            .iter()
            .map(|&ei| vec![0f32; assign[ei].len() * h])
            .collect();
        {
            let mut jobs = Vec::with_capacity(group.len() + 1);
            for ((&ei, g), y) in group.iter().zip(&gs).zip(&mut ys) {
                jobs.push(MatmulJob {
                    x: g,
                    n_tokens: assign[ei].len(),
                    w: &m.experts[ei - m.first_expert].down,
                    out: y,
                });
            }
            if let (Some(sh), true) = (&m.shared, gi == last) {
                jobs.push(MatmulJob {
                    x: &sg,
                    n_tokens: t,
                    w: &sh.down,
                    out: &mut y_shared,
                });
            }
            matmul_batch(&mut jobs);
        }
        for (&ei, ye) in group.iter().zip(&ys) {
            for (k, &(ti, wi)) in assign[ei].iter().enumerate() {
                for (o, &y) in out[ti * h..(ti + 1) * h]
                    .iter_mut()
                    .zip(&ye[k * h..(k + 1) * h])
                {
                    *o += wi * y;
                }
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
    use mlaserve_backend::GgmlType;
    use mlaserve_backend::QMatrix;

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
    fn expert_groups_do_not_change_the_output() {
        let (h, f, e, t) = (64, 32, 8, 13);
        let v = |n: usize, k: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32) * k).sin() * 0.2).collect()
        };
        let mlp = |seed: f32, f: usize| Mlp {
            gate: QMatrix::quantize_from_f32(GgmlType::Q8_0, f, h, &v(f * h, seed)).unwrap(),
            up: QMatrix::quantize_from_f32(GgmlType::Q8_0, f, h, &v(f * h, seed + 0.1)).unwrap(),
            down: QMatrix::from_f32(h, f, v(h * f, seed + 0.2)),
        };
        let m = Moe {
            router: QMatrix::from_f32(e, h, v(e * h, 0.77)),
            correction_bias: None,
            experts: (0..e).map(|i| mlp(0.3 + i as f32 * 0.05, f)).collect(),
            first_expert: 0,
            shared: Some(mlp(0.9, 2 * f)),
        };
        let cfg = cfg(Gating::Softmax, 1, 1, false);
        let x: Vec<f32> = v(t * h, 0.41);
        let whole = moe_forward_in_groups(&cfg, 0, &m, &x, t, usize::MAX);
        for rows in [1, 3, 7, 26] {
            let got = moe_forward_in_groups(&cfg, 0, &m, &x, t, rows);
            assert_eq!(got, whole, "groups of {rows} rows");
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
