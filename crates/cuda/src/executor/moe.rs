//! The MoE FFN of a step, three ways by token count (all deterministic, same routing rules as
//! the CPU's `route`):
//! - up to [`MOE_GEMV_MAX_TOKENS`]: routing on the GPU, one expert-GEMV launch per projection
//!   over all (token, slot) pairs;
//! - up to [`moe_gpu_max_tokens`]: routing on the GPU, the pairs sorted by expert on the GPU,
//!   one grouped tensor-core GEMM launch per projection (moe_grouped.rs);
//! - past that (or where those kernels cannot run): routing on the host, rows gathered in
//!   expert order, two cuBLAS GEMMs per active expert.
//!
//! The first two read nothing back to the host, so decode steps using them can be graphed.
//! The shared experts run as one MLP after any of the three — except for one token of bf16
//! experts, where they are, where their shapes allow (weights.rs, `GMoe::slices`), slices of
//! the expert table that the token takes with weight 1, and the whole FFN is two kernels:
//! gate|up with the SwiGLU in its epilogue, down with the weighted combine into the residual
//! in its epilogue. For one token of quantized gate|up (the shared and routed ones in one
//! block type) the shared gate|up is likewise slices in the routed pairs' int8 GEMV; the
//! shared down then reads their act rows as one vector, adding the routed pairs' combine.

use super::{linear, CudaExecutor};
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use crate::moe_grouped::MOE_SORT_MAX_PAIRS;
use crate::ops::{Gemm, GemmType, RouteCfg, SliceViews};
use crate::qgemv::{PairCombine, QType};
use crate::weights::GLinear;
use crate::weights::GMoe;
use mlaserve_model::layers::ffn::route;
use mlaserve_model::{ModelConfig, MoeConfig};

/// Most tokens on the expert-GEMV path (each pair re-reads its expert's weights).
const MOE_GEMV_MAX_TOKENS: usize = 4;
/// Largest batch on the grouped expert GEMM; the sort's limit (MOE_SORT_MAX_PAIRS / top-k)
/// binds first for every model we know (2,048 tokens at top-8).
const MOE_GROUPED_MAX_TOKENS: usize = 4096;

/// Whether a MoE layer can take the small-batch path (GPU routing + expert GEMVs): the
/// GEMV's 16-byte loads and the routing kernel's shared arrays; other shapes gather + GEMM.
pub(super) fn moe_gemv_ok(m: &GMoe, cfg: &ModelConfig) -> bool {
    let groups = cfg.moe.as_ref().map_or(1, |mc| mc.n_group);
    let slots = cfg.moe.as_ref().map_or(1, |mc| mc.top_k + m.slices);
    let quantized_k_ok =
        |ty: Option<crate::qgemv::QType>, k: usize| ty.is_none() || k <= crate::qgemv::QMV_MAX_K;
    !m.experts.is_empty()
        && quantized_k_ok(m.gate_up_ty, cfg.hidden_size)
        && quantized_k_ok(m.down_ty, m.experts[0].f)
        && cfg.hidden_size.is_multiple_of(8)
        && m.experts[0].f.is_multiple_of(8)
        && m.num_experts <= 1024
        && groups <= 64
        && slots * MOE_GEMV_MAX_TOKENS <= 256
}

/// Most tokens for which a MoE layer stays on the GPU: the GEMV path up to
/// [`MOE_GEMV_MAX_TOKENS`], the sorted grouped GEMM (moe_grouped.rs, sm_80+) up to
/// [`MOE_GROUPED_MAX_TOKENS`] (unless `MLASERVE_MOE_GROUPED=0`); past that, routing on the
/// host and a GEMM per expert.
pub(super) fn moe_gpu_max_tokens(gpu: &Gpu, m: &GMoe, cfg: &ModelConfig) -> usize {
    if !moe_gemv_ok(m, cfg) {
        return 0;
    }
    let k = cfg.moe.as_ref().map_or(1, |mc| mc.top_k).max(1);
    let grouped = std::env::var("MLASERVE_MOE_GROUPED").map_or(true, |v| v != "0");
    if grouped && gpu.has_flash_attn() && m.experts.len() <= 1024 {
        MOE_GROUPED_MAX_TOKENS.min(MOE_SORT_MAX_PAIRS / k)
    } else {
        MOE_GEMV_MAX_TOKENS
    }
}

/// What a MoE FFN reads: the normed rows (`hn` f32 for the router; hnb bf16 for the
/// experts), or, in small steps on the GPU path ([`CudaExecutor::fused_route`]), the residual
/// x [T, H] and the norm's gamma — the routing kernel normalizes x itself and writes hnb.
pub(super) enum FfnIn<'a> {
    Normed(&'a DBuf<f32>),
    Residual { x: u64, gamma: u64 },
}

/// What [`CudaExecutor::moe_small`] leaves to the shared experts.
enum Small {
    /// The shared experts ran with the routed pairs (their slices).
    WithShared,
    /// The routed experts' sum is in out; the shared experts are still to run.
    Routed,
    /// The routed experts' rows `y` [T * k, H], not yet summed into out: the shared expert's
    /// down projection adds them ([`crate::Gpu::qmv_combine`]), or `moe_combine_pairs`.
    Pending { y: DBuf<f32>, comb: PairCombine },
}

impl CudaExecutor {
    /// Whether a step of `t` tokens normalizes, routes and picks experts in one launch
    /// (`moe_norm_route`) ahead of the expert GEMVs: every MoE layer on the small GPU path
    /// (`MLASERVE_FUSED_ROUTE=0`: never, for comparisons).
    pub(super) fn fused_route(&self, t: usize) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on =
            *ON.get_or_init(|| std::env::var("MLASERVE_FUSED_ROUTE").map_or(true, |v| v != "0"));
        on && t <= MOE_GEMV_MAX_TOKENS && self.moe_gpu_max > 0 && t <= self.route_tickets.len()
    }

    /// Routed + shared experts of the step's rows (`inp`, and hnb [T, H] bf16 where `inp` is
    /// normed), accumulated into `out` [T, H].
    pub(super) fn moe(
        &self,
        m: &GMoe,
        t: usize,
        inp: FfnIn,
        hnb: &DBuf<u16>,
        out: u64,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let cfg = self.model.config();
        let mc = cfg
            .moe
            .as_ref()
            .ok_or_else(|| CudaError::Invalid("MoE weights without a MoE config".into()))?;
        let (h, e) = (cfg.hidden_size, m.num_experts);
        let logits = gpu.alloc::<f32>(t * e)?;
        let gpu_max = self.moe_gpu_max;
        let small = t <= MOE_GEMV_MAX_TOKENS && gpu_max > 0;
        // The small path's routing (ids, weights, shared slices), or the routed experts done.
        let routed = match inp {
            FfnIn::Residual { x, gamma } if small && self.fused_route(t) => {
                let s = small_slices(m, gpu, t);
                let pairs = t * (mc.top_k + s);
                let (ids, w) = (gpu.alloc::<i32>(pairs)?, gpu.alloc::<f32>(pairs)?);
                let bias = m.bias_dev.as_ref().map_or(0, |b| b.ptr());
                let rc = route_cfg(m, mc, s);
                // Decided once, here: the routing fences hnb exactly when the expert GEMV
                // after it lets its shared slices skip their wait (bf16 slices: one token,
                // which moe_small takes to the fused kernels; quantized slices wait as every
                // pair of the int8 GEMV does).
                let nowait = s > 0 && m.gate_up_ty.is_none() && gpu.shared_nowait(&rc, h);
                gpu.moe_norm_route(
                    t,
                    x,
                    gamma,
                    cfg.rms_norm_eps,
                    h,
                    m.router.ptr(),
                    hnb.ptr(),
                    logits.ptr(),
                    &self.route_tickets,
                    bias,
                    &rc,
                    ids.ptr(),
                    w.ptr(),
                    nowait,
                )?;
                Some((ids, w, s, nowait))
            }
            FfnIn::Residual { .. } => {
                return Err(CudaError::Invalid(format!(
                    "MoE FFN of {t} tokens given the residual, not its normed rows"
                )))
            }
            FfnIn::Normed(hn) => {
                gpu.gemm(&Gemm::plain(
                    GemmType::F32,
                    t,
                    e,
                    h,
                    hn.ptr(),
                    m.router.ptr(),
                    logits.ptr(),
                ))?;
                if small {
                    let s = small_slices(m, gpu, t);
                    let (ids, w) = self.route_on_gpu(m, mc, t, &logits, s)?;
                    Some((ids, w, s, false))
                } else if t <= gpu_max {
                    self.moe_grouped(m, mc, t, &logits, hnb, out)?;
                    None
                } else {
                    self.moe_host(m, mc, t, &logits, hnb, out)?;
                    None
                }
            }
        };
        // `ids` and `w` live to the end: a pending combine reads w. Pending where the shared
        // expert's down projection can add it (one quantized token's).
        let defer = match m.shared.as_ref().map(|sh| &sh.down) {
            Some(GLinear::Quant(q)) => gpu.combine_fits(q, t, mc.top_k),
            _ => false,
        };
        let small = match &routed {
            Some((ids, w, s, nowait)) => {
                let r = (ids, w, *s);
                Some(self.moe_small(m, mc, t, r, hnb, out, defer, *nowait)?)
            }
            None => None,
        };
        match (&m.shared, small) {
            (_, Some(Small::WithShared)) => Ok(()),
            (Some(sh), None | Some(Small::Routed)) => self.mlp(sh, t, hnb.ptr(), out, None),
            (Some(sh), Some(Small::Pending { y, comb })) => {
                self.mlp(sh, t, hnb.ptr(), out, Some(comb))?;
                drop(y);
                Ok(())
            }
            (None, Some(Small::Pending { y, comb })) => {
                gpu.moe_combine_pairs(t, out, y.ptr(), comb.w, comb.k, h)
            }
            (None, None | Some(Small::Routed)) => Ok(()),
        }
    }

    /// Routing on the host with the CPU's `route`, rows gathered in expert order, two cuBLAS
    /// GEMMs per active expert, a deterministic combine.
    fn moe_host(
        &self,
        m: &GMoe,
        mc: &MoeConfig,
        t: usize,
        logits: &DBuf<f32>,
        hnb: &DBuf<u16>,
        out: u64,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let (h, e, k) = (self.model.config().hidden_size, m.num_experts, mc.top_k);
        let logits = gpu.to_host(logits)?;
        // Rows grouped by expert: rows_of[e] = (token, slot j in its top-k).
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
        let mut weights = vec![0f32; t * k];
        for ti in 0..t {
            let (idx, w) = route(
                mc,
                &logits[ti * e..(ti + 1) * e],
                m.correction_bias.as_deref(),
            );
            for (j, (&ei, &wi)) in idx.iter().zip(&w).enumerate() {
                by_expert[ei].push((ti, j));
                weights[ti * k + j] = wi;
            }
        }
        let mut gather = Vec::with_capacity(t * k);
        let mut row_of = vec![-1i32; t * k];
        let mut ranges = Vec::new();
        let held = m.first_expert..m.first_expert + m.experts.len();
        for (ei, list) in by_expert.iter().enumerate() {
            if list.is_empty() || !held.contains(&ei) {
                continue;
            }
            let r0 = gather.len();
            for &(ti, j) in list {
                row_of[ti * k + j] = gather.len() as i32;
                gather.push(ti as i32);
            }
            ranges.push((ei, r0, gather.len()));
        }
        let rows = gather.len();
        let f = m.experts[0].f;
        let gather_d = gpu.upload(&gather)?;
        let xe = gpu.alloc::<u16>(rows * h)?;
        gpu.gather_rows(hnb.ptr(), gather_d.ptr(), rows, xe.ptr(), h)?;
        let gu = gpu.alloc::<f32>(rows * 2 * f)?;
        for &(ei, r0, r1) in &ranges {
            let g = &m.experts[ei - m.first_expert].gate_up;
            linear(gpu, r1 - r0, xe.at(r0 * h), g, gu.at(r0 * 2 * f), false)?;
        }
        let act = gpu.alloc::<u16>(rows * f)?;
        gpu.silu_mul(gu.ptr(), act.ptr(), f, rows)?;
        let ye = gpu.alloc::<f32>(rows * h)?;
        for &(ei, r0, r1) in &ranges {
            let d = &m.experts[ei - m.first_expert].down;
            linear(gpu, r1 - r0, act.at(r0 * f), d, ye.at(r0 * h), false)?;
        }
        let row_d = gpu.upload(&row_of)?;
        let w_d = gpu.upload(&weights)?;
        gpu.moe_combine(t, out, ye.ptr(), row_d.ptr(), w_d.ptr(), k, h)?;
        Ok(())
    }

    /// Routing on the GPU, pairs sorted by expert on the GPU, one grouped GEMM launch per
    /// projection (moe_grouped.rs); no host round trip.
    fn moe_grouped(
        &self,
        m: &GMoe,
        mc: &MoeConfig,
        t: usize,
        logits: &DBuf<f32>,
        hnb: &DBuf<u16>,
        out: u64,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let (h, k, f) = (self.model.config().hidden_size, mc.top_k, m.experts[0].f);
        let pairs = t * k;
        let (ids, w) = self.route_on_gpu(m, mc, t, logits, 0)?;
        let sorted = gpu.moe_sort(pairs, ids.ptr(), m.first_expert, m.experts.len())?;
        let (gate_up, down) = (m.gate_up_ptrs.ptr(), m.down_ptrs.ptr());
        let act = gpu.alloc::<u16>(pairs * f)?;
        if m.gate_up_ty.is_none() && gpu.moe_glu_fits(pairs, m.experts.len()) {
            gpu.moe_gemm_glu(&sorted, gate_up, hnb.ptr(), k, true, f, h, act.ptr())?;
        } else {
            let gu = gpu.alloc::<f32>(pairs * 2 * f)?;
            gpu.moe_gemm(
                &sorted,
                m.gate_up_ty,
                gate_up,
                hnb.ptr(),
                k,
                true,
                2 * f,
                h,
                gu.ptr(),
            )?;
            gpu.silu_mul(gu.ptr(), act.ptr(), f, pairs)?;
        }
        let y = gpu.alloc::<f32>(pairs * h)?;
        gpu.moe_gemm(&sorted, m.down_ty, down, act.ptr(), 1, false, h, f, y.ptr())?;
        gpu.moe_combine(t, out, y.ptr(), sorted.pos.ptr(), w.ptr(), k, h)?;
        Ok(())
    }

    /// Expert ids [T*slots] i32 and weights [T*slots] f32 of router logits [T, E], on the
    /// GPU: each token's top-k, then its shared slices.
    fn route_on_gpu(
        &self,
        m: &GMoe,
        mc: &MoeConfig,
        t: usize,
        logits: &DBuf<f32>,
        shared: usize,
    ) -> Result<(DBuf<i32>, DBuf<f32>)> {
        let pairs = t * (mc.top_k + shared);
        let ids = self.gpu.alloc::<i32>(pairs)?;
        let w = self.gpu.alloc::<f32>(pairs)?;
        let rc = route_cfg(m, mc, shared);
        let bias = m.bias_dev.as_ref().map_or(0, |b| b.ptr());
        self.gpu
            .moe_route(t, logits.ptr(), bias, &rc, ids.ptr(), w.ptr())?;
        Ok((ids, w))
    }

    /// Small batches: routing on the GPU and one expert-GEMV launch per projection over all
    /// (token, slot) pairs — no host round trip, no launch per expert. Returns whether the
    /// shared experts were computed too. Bf16 experts of one token: routed pairs and shared
    /// slices through the two fused kernels (SwiGLU and combine in their epilogues); more
    /// tokens of bf16 experts up to `MLASERVE_MOE_FUSED_TOKENS` (default one) the routed
    /// pairs alone on them. Else the per-pair GEMV chain, x quantized to int8 in each block
    /// for quantized experts (qgemv.rs), whose weighted sum is left pending (`defer`) for the
    /// shared expert's down projection to add. Both read an expert once a pair, so the shared
    /// experts of several tokens (every token's) run apart, read once. `nowait`: the routing
    /// kernel ran just before and fenced hnb, the caller having decided with
    /// [`Gpu::shared_nowait`] (`moe`, once a layer), so the shared slices skip their wait.
    #[allow(clippy::too_many_arguments)]
    fn moe_small(
        &self,
        m: &GMoe,
        mc: &MoeConfig,
        t: usize,
        (ids, w, s): (&DBuf<i32>, &DBuf<f32>, usize),
        hnb: &DBuf<u16>,
        out: u64,
        defer: bool,
        nowait: bool,
    ) -> Result<Small> {
        let gpu = &self.gpu;
        let (h, f) = (self.model.config().hidden_size, m.experts[0].f);
        let (gate_up, down) = (m.gate_up_ptrs.ptr(), m.down_ptrs.ptr());
        let first = m.first_expert;
        let bf16 = m.gate_up_ty.is_none() && m.down_ty.is_none();
        if bf16 && t <= fused_tokens() {
            let k = mc.top_k + s;
            let (held, pairs) = (m.experts.len() + s, t * k);
            let views = match (s, &m.shared) {
                (1.., Some(sh)) => SliceViews {
                    e_routed: m.num_experts,
                    fs: sh.f,
                },
                _ => SliceViews::NONE,
            };
            let act = gpu.alloc::<u16>(pairs * f)?;
            let (ip, ap) = (ids.ptr(), act.ptr());
            let ex = (first, held, ip, hnb.ptr(), k, mc.top_k);
            gpu.moe_gemv_swiglu_after(pairs, gate_up, ex, h, f, views, ap, nowait)?;
            // ids are final here: the SwiGLU kernel just before, over the same ids, lets the
            // combine in only after its routed blocks waited for the routing that wrote them
            let ex = (first, held, ip, ap, w.ptr());
            gpu.moe_gemv_combine_after(t, k, down, ex, f, h, views, out, true)?;
            return Ok(if s > 0 {
                Small::WithShared
            } else {
                Small::Routed
            });
        }
        // Quantized experts with s shared slices (one token: `small_slices`): the
        // gate|up runs over the k routed pairs and the s slices, whose act rows k..k + s are
        // the shared MLP's intermediate [fs]; the down over the k routed pairs alone.
        let sh = match (s, &m.shared) {
            (0, _) => None,
            (1.., Some(sh)) if t == 1 && m.gate_up_ty.is_some() => Some(sh),
            _ => {
                return Err(CudaError::Invalid(format!(
                    "{s} shared slices routed for the per-pair expert chain over {t} tokens of \
                     {:?} experts (one token of quantized gate|up only)",
                    m.gate_up_ty
                )))
            }
        };
        let (k, held) = (mc.top_k, m.experts.len());
        let pairs = t * k;
        // One expert-GEMV launch over all pairs: x [*, width] bf16; pair p reads row p / x_div.
        let gemv = |ty: Option<QType>,
                    ptrs: u64,
                    x: u64,
                    x_div: usize,
                    width: usize,
                    rows: usize,
                    out: u64|
         -> Result<()> {
            let ids = ids.ptr();
            match ty {
                None => gpu.moe_gemv(pairs, ptrs, first, held, ids, x, x_div, width, rows, out),
                Some(ty) => gpu.qmv_pairs(
                    ty, pairs, ptrs, first, held, ids, x, width, x_div, rows, out,
                ),
            }
        };
        let act = gpu.alloc::<u16>(t * (k + s) * f)?;
        match m.gate_up_ty {
            // Quantized: the SwiGLU in the expert GEMV's epilogue (the same sums and bits).
            Some(ty) if gpu.qmv_glu_on() => {
                let views = match sh {
                    Some(sh) => SliceViews {
                        e_routed: m.num_experts,
                        fs: sh.f,
                    },
                    None => SliceViews::NONE,
                };
                let p = (t * (k + s), gate_up, first, held + s, ids.ptr());
                gpu.qmv_pairs_glu(ty, p, hnb.ptr(), h, k + s, f, views, act.ptr())?
            }
            _ if s > 0 => {
                return Err(CudaError::Invalid(
                    "shared slices routed with the SwiGLU epilogue off (MLASERVE_QMV_GLU=0)".into(),
                ))
            }
            _ => {
                let gu = gpu.alloc::<f32>(pairs * 2 * f)?;
                gemv(m.gate_up_ty, gate_up, hnb.ptr(), k, h, 2 * f, gu.ptr())?;
                gpu.silu_mul(gu.ptr(), act.ptr(), f, pairs)?;
            }
        }
        let y = gpu.alloc::<f32>(pairs * h)?;
        match m.down_ty {
            // every block of the gate|up kernels before waited for the routing: ids are final
            Some(ty) => {
                let p = (pairs, down, first, held, ids.ptr());
                gpu.qmv_pairs_after(ty, p, act.ptr(), f, 1, h, y.ptr(), true)?
            }
            None => gemv(None, down, act.ptr(), 1, f, h, y.ptr())?,
        }
        let comb = PairCombine {
            y: y.ptr(),
            w: w.ptr(),
            k,
        };
        if let Some(sh) = sh {
            // the shared down over the slices' intermediate, adding the routed pairs' sum
            self.mlp_down(sh, 1, act.at(k * f), out, Some(comb))?;
            return Ok(Small::WithShared);
        }
        if !defer {
            gpu.moe_combine_pairs(t, out, y.ptr(), w.ptr(), k, h)?;
            return Ok(Small::Routed);
        }
        Ok(Small::Pending { y, comb })
    }
}

/// Shared-expert slices the small path routes for a step of `t` tokens: the layer's slices
/// for one token of bf16 experts (the fused kernels run them with the routed pairs) or of
/// quantized gate|up with the SwiGLU epilogue on (the int8 gate|up GEMV over pairs runs them;
/// weights.rs made none with `MLASERVE_QMV_SLICES=0`), else 0.
fn small_slices(m: &GMoe, gpu: &Gpu, t: usize) -> usize {
    let bf16 = m.gate_up_ty.is_none() && m.down_ty.is_none();
    let quant = m.gate_up_ty.is_some() && gpu.qmv_glu_on();
    if t == 1 && ((bf16 && fused_tokens() >= 1) || quant) {
        m.slices
    } else {
        0
    }
}

/// The routing rules of layer `m` as the kernels take them, with `shared` slices appended.
fn route_cfg(m: &GMoe, mc: &MoeConfig, shared: usize) -> RouteCfg {
    RouteCfg {
        experts: m.num_experts,
        top_k: mc.top_k,
        gating: match mc.gating {
            mlaserve_model::Gating::Softmax => 0,
            mlaserve_model::Gating::Sigmoid => 1,
        },
        n_group: mc.n_group,
        topk_group: mc.topk_group,
        norm: mc.norm_topk_prob,
        scale: mc.routed_scaling_factor,
        shared,
    }
}

/// Most tokens on the fused expert kernels (`MLASERVE_MOE_FUSED_TOKENS`, default 1): they read
/// an expert once a pair, as the per-pair chain does, in 2 launches instead of 4.
fn fused_tokens() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("MLASERVE_MOE_FUSED_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    })
}
