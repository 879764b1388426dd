//! The attention of a step (steps 1-3 of the module doc above, from the normed hidden rows
//! on; the norm itself is the step's, or the first projection GEMV's): q and the latent rows,
//! the latent cache write, DSA's key selection, then each sequence's path — unabsorbed
//! (prefill and chunked prefill: positions gathered and decompressed by W_UK/W_UV, one
//! attention kernel) or absorbed (decode: q_lat = W_UK·q_nope, the split kernel over the
//! paged latent cache, out = W_UV·o_lat) — adding into the same output rows.
//!
//! Invariants:
//! - A token's own latent row is in the cache before any path reads it, but on the two fused
//!   decode paths: the one-token cluster kernel (`mla_attn_cl`) finishes the row, writes it
//!   to the cache and takes its key from shared memory; after `mla_q_absorb` (which writes
//!   it) the wgmma decode reads that row only after its wait (`Early::TileButNew`).
//! - Each path sees zero keys for the other's tokens, so their outputs add.
//! - The fused paths are taken only where the unfused ones would compute the same rows (their
//!   knobs compare the two).

use super::{linear, quant_norm_kv_allowed, CudaExecutor, GpuCache, MQA_MAX_SPLITS};
use crate::error::{CudaError, Result};
use crate::gemv::{GemvMat, GemvX};
use crate::gpu::{DBuf, Gpu};
use crate::mla_cluster::ClusterAttn;
use crate::mla_decode::Early;
use crate::ops::{AttnDims, Gemm, GemmType, KeyLists, KvFinish};
use crate::qgemv::{QmvAlso, QmvNorm};
use crate::step_inputs::{KeyListSet, StepInputs};
use crate::weights::{GLayer, GLinear, GMat};
use mlaserve_model::layers::dsa::top_k;
use mlaserve_model::probe::{self, PathTag};
use mlaserve_model::ForwardBatch;

/// Where the absorbed path's W_UV product goes: f32 rows (out = beta·out + product), or the
/// bf16 rows o_proj reads (decode-only steps: no f32 copy and no cast kernel).
#[derive(Clone, Copy)]
enum AttnOut {
    F32 { ptr: u64, beta: f32 },
    Bf16(u64),
}

/// q as the absorbed path receives it.
enum QIn {
    /// q_pe rotated; the bf16 copy W_UK reads where q_finish made one (else cast there).
    Rotated(Option<DBuf<u16>>),
    /// q_pe not rotated yet: the fused W_UK launch rotates it with these cos/sin rows, and
    /// finishes and caches the latent rows too where `kv` is given (not done before).
    Unrotated {
        cos: u64,
        sin: u64,
        kv: Option<KvFinish>,
    },
}

/// Whether a step that runs the fused W_UK launch finishes its latent rows there, not in a
/// kv_finish launch of their own (`MLASERVE_FUSED_KV=0`: never, for comparisons).
fn kv_finish_fused() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_FUSED_KV").map_or(true, |v| v != "0"))
}

/// Most tokens on the fused absorbed projections (mla_absorb.cu): each (token, head) block
/// reads its head's W_UK/W_UV rows (2 MiB a layer for 16 heads; L2-resident), so larger steps
/// keep cuBLAS's strided-batched GEMMs, which read them once.
const ABSORB_FUSED_MAX_T: usize = 4;

/// Whether the absorbed path of `d` runs its projections fused with their neighbours
/// (`MLASERVE_FUSED_ABSORB=0`: never, for comparisons).
fn absorb_fused(d: &AttnDims) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("MLASERVE_FUSED_ABSORB").map_or(true, |v| v != "0"));
    on && d.t <= ABSORB_FUSED_MAX_T
        && d.p.is_multiple_of(8)
        && d.p <= 512
        && d.r.is_multiple_of(2)
        && d.l.is_multiple_of(8)
        && d.l <= 1024
}

/// Whether every one of the step's `t` tokens takes the absorbed path over `lists` and
/// nothing else (no MHA rows, no flash tiles) and no probe asks for the f32 rows between.
fn absorbed_alone(lists: &KeyListSet, t: usize) -> bool {
    lists.max_mqa > 0
        && (0..t).all(|i| lists.n_mqa_h[i] > 0)
        && !lists.any_mha
        && lists.n_flash_tiles == 0
        && !probe::active()
}

/// [`linear`] over a matrix that is always bf16 (the absorbed W_UK / W_UV).
fn gemm_bf16(gpu: &Gpu, m: usize, x: u64, w: &GMat, out: u64) -> Result<()> {
    gpu.gemm(&Gemm::plain(
        GemmType::Bf16,
        m,
        w.rows,
        w.cols,
        x,
        w.w.ptr(),
        out,
    ))
}

impl CudaExecutor {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        li: usize,
        layer: &GLayer,
        batch: &ForwardBatch,
        inp: &StepInputs,
        cache: &GpuCache,
        hnb: &DBuf<u16>,
        norm_in: Option<GemvX>,
        out: u64,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let cfg = self.model.config();
        let w = &layer.mla;
        let t = batch.num_tokens();
        let (n, p, r, v, l) = (
            w.num_heads,
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
            cfg.kv_lora_rank,
        );
        let (qk, lw, eps) = (p + r, l + r, cfg.rms_norm_eps);
        // q [T, N*qk] f32; q_c [T, Lq] bf16 (the indexer reads it too); kv [T, L+R] f32.
        // hnb multiplies q_a (q_lora) or q_proj, and kv_a: one GEMV launch for both where
        // norm_in is given (it normalizes x first), else two products of hnb.
        let q = gpu.alloc::<f32>(t * n * qk)?;
        let kv = gpu.alloc::<f32>(t * lw)?;
        let q_lora = w.q_a.as_ref().zip(w.q_a_norm.as_ref());
        let (q_in, lq) = match q_lora {
            Some((q_a, _)) => (q_a, q_a.rows()),
            None => (&w.q_b, 0),
        };
        let qa = gpu.alloc::<f32>(t * lq)?;
        let q_in_out = if q_lora.is_some() { qa.ptr() } else { q.ptr() };
        match (norm_in, q_in, &w.kv_a) {
            (Some(x), GLinear::Bf16(a), GLinear::Bf16(b)) => {
                let mats = [
                    GemvMat {
                        w: a.w.ptr(),
                        rows: a.rows,
                        out: q_in_out,
                        ld: a.rows,
                    },
                    GemvMat {
                        w: b.w.ptr(),
                        rows: b.rows,
                        out: kv.ptr(),
                        ld: lw,
                    },
                ];
                gpu.gemv_bf16(t, a.cols, x, &mats, false)?;
            }
            (Some(GemvX::Norm { x, gamma, eps, .. }), GLinear::Quant(a), kv_a) => {
                // The quantized product normalizes x itself and leaves hnb (for the indexer),
                // with kv_a in the same launch where it can (one hand-off fewer), else after it
                // reading hnb.
                let n = QmvNorm {
                    x,
                    gamma,
                    eps,
                    hnb: hnb.ptr(),
                };
                match kv_a {
                    GLinear::Quant(b)
                        if quant_norm_kv_allowed() && gpu.qmv_norm_fits(a, Some(b))? =>
                    {
                        let also = QmvAlso {
                            w: b,
                            out: kv.ptr(),
                        };
                        gpu.qmv_norm(a, n, q_in_out, Some(also))?;
                    }
                    _ => {
                        gpu.qmv_norm(a, n, q_in_out, None)?;
                        linear(gpu, t, n.hnb, kv_a, kv.ptr(), false)?;
                    }
                }
            }
            (Some(_), _, _) => {
                return Err(CudaError::Invalid(
                    "fused attention norm over projections that are neither both bf16 nor a \
                     quantized q_a / q_proj"
                        .into(),
                ))
            }
            (None, _, _) => {
                linear(gpu, t, hnb.ptr(), q_in, q_in_out, false)?;
                linear(gpu, t, hnb.ptr(), &w.kv_a, kv.ptr(), false)?;
            }
        }
        let q_c = match q_lora {
            Some((_, norm)) => {
                let qcb = gpu.alloc::<u16>(t * lq)?;
                gpu.rms_norm(t, qa.ptr(), lq, 0, norm.ptr(), 0, 0, qcb.ptr(), lq, lq, eps)?;
                linear(gpu, t, qcb.ptr(), &w.q_b, q.ptr(), false)?;
                Some((qcb, lq))
            }
            None => None,
        };
        let dims = AttnDims {
            t,
            heads: n,
            p,
            r,
            v,
            l,
            scale: cfg.softmax_scale(),
        };
        let decode_only = batch.is_decode.iter().all(|&d| d);
        // kv: RMSNorm(kv_c), RoPE(k_pe) and the cache write, one kernel — or, where the step
        // takes the fused absorbed path over the dense key lists (no indexer), no probe reads
        // the rows before it and every sequence brings one token (the decode then defers only
        // each token's own new row: Early::TileButNew; a forced-MQA prefill chunk would have
        // others in its lists), inside the fused W_UK launch or `mla_attn_cl` (`kv_in_absorb`).
        let layer_cache = cache.latent.at(li * cache.slots() * lw);
        let kv_in_absorb = kv_finish_fused()
            && decode_only
            && batch.seqs.iter().all(|s| s.tokens.len() == 1)
            && layer.indexer.is_none()
            && absorbed_alone(&inp.dense, t)
            && absorb_fused(&dims);
        if !kv_in_absorb {
            gpu.kv_finish(
                t,
                kv.ptr(),
                lw,
                w.kv_a_norm.ptr(),
                l,
                r,
                eps,
                inp.cos.ptr(),
                inp.sin.ptr(),
                inp.slots.ptr(),
                layer_cache,
            )?;
        }
        if probe::active() {
            self.probe_dev(
                Some(li),
                "mla.kv_c_normed",
                PathTag::None,
                &[t, l],
                kv.ptr(),
                t,
                l,
                lw,
            )?;
            self.probe_dev(
                Some(li),
                "mla.k_pe",
                PathTag::None,
                &[t, r],
                kv.at(l),
                t,
                r,
                lw,
            )?;
        }

        // Key lists: DSA top-k where the indexer selects, else dense causal.
        let selected = match (&layer.indexer, &cfg.indexer, &q_c, &cache.index) {
            (Some(iw), Some(ic), Some((qcb, _)), Some(icache)) => {
                self.dsa_select(li, iw, ic, batch, inp, hnb, qcb, icache, cache)?
            }
            _ => vec![None; t],
        };
        let per_layer;
        let lists = if selected.iter().all(Option::is_none) {
            &inp.dense
        } else {
            per_layer = KeyListSet::build(gpu, batch, &selected, self.flash)?;
            &per_layer
        };
        let bs = batch.block_size;
        // o_proj's input [T, N*V] bf16. A step of decode tokens only (no probe asking for the
        // f32 rows) takes the absorbed path alone, whose W_UV product writes it directly.
        let ob = gpu.alloc::<u16>(t * n * v)?;
        let dec: Vec<usize> = (0..t).filter(|&i| lists.n_mqa_h[i] > 0).collect();
        let absorbed_only = absorbed_alone(lists, t);
        // q_pe rotated in place: inside the fused W_UK launch where the step takes the absorbed
        // path alone, else by q_finish with the bf16 copy W_UK reads (decode steps) or rope.
        let (cos, sin) = (inp.cos.ptr(), inp.sin.ptr());
        let qin = if decode_only && absorbed_only && absorb_fused(&dims) {
            let kv = kv_in_absorb.then_some(KvFinish {
                kv: kv.ptr(),
                ks: lw,
                w: w.kv_a_norm.ptr(),
                eps,
                slots: inp.slots.ptr(),
                cache: layer_cache,
            });
            QIn::Unrotated { cos, sin, kv }
        } else if kv_in_absorb {
            return Err(CudaError::Invalid(format!(
                "layer {li}: the latent rows were left to the fused W_UK launch, which this \
                 step does not take"
            )));
        } else if decode_only {
            let qb = gpu.alloc::<u16>(t * n * qk)?;
            gpu.q_finish(t, q.ptr(), n * qk, n, qk, p, r, cos, sin, qb.ptr())?;
            QIn::Rotated(Some(qb))
        } else {
            gpu.rope(t, q.ptr(), n * qk, n, qk, p, r, cos, sin)?;
            QIn::Rotated(None)
        };
        if absorbed_only {
            let keys = KeyLists {
                n_keys: lists.n_mqa.ptr(),
                sel_off: lists.sel_off.ptr(),
                sel_pos: lists.sel_pos.ptr(),
            };
            let to = AttnOut::Bf16(ob.ptr());
            let (dims, max_keys) = (&dims, lists.max_mqa);
            self.absorbed(li, w, dims, max_keys, q.ptr(), &qin, &keys, inp, cache, to)?;
            return linear(gpu, t, ob.ptr(), &w.o_proj, out, true);
        }
        // attn_out [T, N*V]: the MHA kernel writes every row (zeros for absorbed tokens),
        // the absorbed path then accumulates its rows.
        let attn_out = gpu.alloc::<f32>(t * n * v)?;
        // Unabsorbed sequences: their positions decompressed [S, N*P] / [S, N*V].
        let s_total = lists.mha_slots.len();
        let mha = if s_total > 0 {
            let slots_d = &lists.mha_slots;
            let kvc = gpu.alloc::<u16>(s_total * l)?;
            let kpe = gpu.alloc::<f32>(s_total * r)?;
            gpu.gather_latent(
                s_total,
                layer_cache,
                slots_d.ptr(),
                lw,
                l,
                kvc.ptr(),
                kpe.ptr(),
            )?;
            let k_nope = gpu.alloc::<f32>(s_total * n * p)?;
            let vals = gpu.alloc::<f32>(s_total * n * v)?;
            gemm_bf16(gpu, s_total, kvc.ptr(), &w.w_uk, k_nope.ptr())?;
            gemm_bf16(gpu, s_total, kvc.ptr(), &w.w_uv, vals.ptr())?;
            Some((kpe, k_nope, vals))
        } else {
            None
        };
        let (kpe_p, kn_p, v_p) = mha
            .as_ref()
            .map_or((0, 0, 0), |(a, b, c)| (a.ptr(), b.ptr(), c.ptr()));
        // Rows of attn_out: the CUDA-core kernel writes every row (zeros past its tokens);
        // without it the absorbed path's rows must start at zero before they are added to.
        if lists.any_mha {
            let keys = KeyLists {
                n_keys: lists.n_mha.ptr(),
                sel_off: lists.sel_off.ptr(),
                sel_pos: lists.sel_pos.ptr(),
            };
            gpu.attn_mha(
                &dims,
                q.ptr(),
                kn_p,
                kpe_p,
                v_p,
                attn_out.ptr(),
                &keys,
                lists.kv_base.ptr(),
            )?;
        } else if lists.max_mqa > 0 && lists.n_flash_tiles > 0 {
            gpu.zero(&attn_out)?;
        }
        if let (Some(f), true) = (&self.flash, lists.n_flash_tiles > 0) {
            gpu.attn_flash(
                &dims,
                f,
                q.ptr(),
                kn_p,
                kpe_p,
                v_p,
                s_total,
                attn_out.ptr(),
                lists.flash_tiles.ptr(),
                lists.n_flash_tiles,
                lists.n_flash.ptr(),
                lists.kv_base.ptr(),
            )?;
        }
        if lists.max_mqa > 0 {
            if dec.len() == t {
                let keys = KeyLists {
                    n_keys: lists.n_mqa.ptr(),
                    sel_off: lists.sel_off.ptr(),
                    sel_pos: lists.sel_pos.ptr(),
                };
                let out = AttnOut::F32 {
                    ptr: attn_out.ptr(),
                    beta: 0.0,
                };
                let (dims, max_keys) = (&dims, lists.max_mqa);
                self.absorbed(li, w, dims, max_keys, q.ptr(), &qin, &keys, inp, cache, out)?;
            } else {
                // Mixed batch: the absorbed path runs on its tokens only, compacted.
                let d = dec.len();
                let idx: Vec<i32> = dec.iter().map(|&i| i as i32).collect();
                let idx_d = gpu.upload(&idx)?;
                let qc = gpu.alloc::<f32>(d * n * qk)?;
                gpu.gather_rows_f32(q.ptr(), idx_d.ptr(), d, qc.ptr(), n * qk)?;
                let pick = |v: &[i32]| dec.iter().map(|&i| v[i]).collect::<Vec<i32>>();
                let n_keys = gpu.upload(&pick(&lists.n_mqa_h))?;
                let sel_off = gpu.upload(&pick(&lists.sel_off_h))?;
                let bt_off = gpu.upload(&pick(&inp.bt_off_h))?;
                let keys = KeyLists {
                    n_keys: n_keys.ptr(),
                    sel_off: sel_off.ptr(),
                    sel_pos: lists.sel_pos.ptr(),
                };
                let oc = gpu.alloc::<f32>(d * n * v)?;
                let dims_c = AttnDims { t: d, ..dims };
                self.absorbed_with(
                    li,
                    w,
                    &dims_c,
                    lists.max_mqa,
                    qc.ptr(),
                    &QIn::Rotated(None),
                    &keys,
                    inp.block_tables.ptr(),
                    bt_off.ptr(),
                    bs,
                    cache,
                    AttnOut::F32 {
                        ptr: oc.ptr(),
                        beta: 0.0,
                    },
                )?;
                gpu.add_rows_indexed(attn_out.ptr(), oc.ptr(), idx_d.ptr(), d, n * v)?;
            }
        }
        if probe::active() {
            let tag = if batch.is_decode.iter().all(|&d| d) {
                PathTag::Mqa
            } else if batch.seqs.iter().any(|s| s.context_len > 0) {
                PathTag::Context
            } else {
                PathTag::Mha
            };
            self.probe_dev(
                Some(li),
                "mla.attn_out",
                tag,
                &[t, n, v],
                attn_out.ptr(),
                t,
                n * v,
                n * v,
            )?;
        }
        gpu.to_bf16(attn_out.ptr(), ob.ptr(), t * n * v)?;
        linear(gpu, t, ob.ptr(), &w.o_proj, out, true)
    }

    /// The absorbed path over all of the step's tokens (every one a decode token).
    #[allow(clippy::too_many_arguments)]
    fn absorbed(
        &self,
        li: usize,
        w: &crate::weights::GMla,
        dims: &AttnDims,
        max_keys: usize,
        q: u64,
        qin: &QIn,
        keys: &KeyLists,
        inp: &StepInputs,
        cache: &GpuCache,
        out: AttnOut,
    ) -> Result<()> {
        self.absorbed_with(
            li,
            w,
            dims,
            max_keys,
            q,
            qin,
            keys,
            inp.block_tables.ptr(),
            inp.bt_off.ptr(),
            cache.block_size,
            cache,
            out,
        )
    }

    /// Absorbed attention for `dims.t` tokens: q [T, N*(P+R)] f32 (`qin`: q_pe rotated or
    /// not yet, a bf16 copy or not) -> q_lat = W_UK·q_nope per head, the split-context decode
    /// kernel over the paged cache, its LSE combine, then W_UV·o_lat into `out` [T, N*V] —
    /// for small steps ([`absorb_fused`]) as 3 launches (mla_absorb.cu), else 5 (cast, cuBLAS
    /// strided-batched over heads, decode, combine, cuBLAS).
    #[allow(clippy::too_many_arguments)]
    fn absorbed_with(
        &self,
        li: usize,
        w: &crate::weights::GMla,
        dims: &AttnDims,
        max_keys: usize,
        q: u64,
        qin: &QIn,
        keys: &KeyLists,
        block_tables: u64,
        bt_off: u64,
        bs: usize,
        cache: &GpuCache,
        out: AttnOut,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let (t, n, p, r, v, l) = (dims.t, dims.heads, dims.p, dims.r, dims.v, dims.l);
        let qk = p + r;
        let layer_cache = cache.latent.at(li * cache.slots() * (l + r));
        let fused = absorb_fused(dims);
        // One token a sequence with its latent rows still to finish (the executor's
        // `kv_in_absorb`): the whole chain in one launch where the cluster kernel is picked.
        if let QIn::Unrotated {
            cos,
            sin,
            kv: Some(ref f),
        } = *qin
        {
            if fused && gpu.mla_attn_cluster_picked(dims, max_keys) {
                let (out, out_bf16, beta) = match out {
                    AttnOut::F32 { ptr, beta } => (ptr, false, beta),
                    AttnOut::Bf16(ptr) => (ptr, true, 0.0),
                };
                let a = ClusterAttn {
                    q,
                    cos,
                    sin,
                    kv: f,
                    w_uk_t: w.w_uk_t.w.ptr(),
                    w_uv: w.w_uv.w.ptr(),
                    keys,
                    block_tables,
                    bt_off,
                    block_size: bs,
                    out,
                    out_bf16,
                    beta,
                };
                return gpu.mla_attn_cluster(dims, &a);
            }
        }
        let q_lat = gpu.alloc::<f32>(t * n * l)?;
        match *qin {
            QIn::Unrotated { cos, sin, ref kv } if fused => gpu.mla_q_absorb(
                dims,
                q,
                w.w_uk_t.w.ptr(),
                q_lat.ptr(),
                Some((cos, sin)),
                kv.as_ref(),
            )?,
            QIn::Unrotated { .. } => {
                return Err(CudaError::Invalid(
                    "absorbed attention: q_pe not rotated on a step too large for the fused \
                     W_UK"
                        .into(),
                ))
            }
            QIn::Rotated(_) if fused => {
                gpu.mla_q_absorb(dims, q, w.w_uk_t.w.ptr(), q_lat.ptr(), None, None)?
            }
            QIn::Rotated(ref qb) => {
                let owned;
                let qb = match qb {
                    Some(b) => b.ptr(),
                    None => {
                        owned = gpu.alloc::<u16>(t * n * qk)?;
                        gpu.to_bf16(q, owned.ptr(), t * n * qk)?;
                        owned.ptr()
                    }
                };
                gpu.gemm(&Gemm {
                    m: t,
                    n: l,
                    k: p,
                    ty: GemmType::Bf16,
                    x: qb,
                    ldx: n * qk,
                    stride_x: qk,
                    w: w.w_uk_t.w.ptr(),
                    ldw: p,
                    stride_w: l * p,
                    out: q_lat.ptr(),
                    ldo: n * l,
                    stride_o: l,
                    batch: n,
                    beta: 0.0,
                })?;
            }
        }
        // The tensor-core kernel (16, 32 or 64 heads per block) and its measured split rule; it
        // falls back to the CUDA-core kernel for other latent widths, older GPUs or too
        // little shared memory.
        let splits = gpu.mqa_tc_splits(t, n, max_keys, MQA_MAX_SPLITS)?;
        let part = gpu.alloc::<f32>(t * n * splits * l)?;
        let lse = gpu.alloc::<f32>(t * n * splits)?;
        let o_lat = match fused {
            true => None,
            false => Some(gpu.alloc::<u16>(t * n * l)?),
        };
        gpu.attn_mqa_tc(
            dims,
            q_lat.ptr(),
            q,
            layer_cache,
            keys,
            block_tables,
            bt_off,
            bs,
            splits,
            part.ptr(),
            lse.ptr(),
            o_lat.as_ref().map_or(0, |o| o.ptr()),
            // mla_q_absorb just before: every input older than it, but the new rows where it
            // finished them.
            match qin {
                QIn::Unrotated {
                    kv: Some(ref f), ..
                } if fused => Early::TileButNew(f.slots),
                _ if fused => Early::Tile,
                _ => Early::No,
            },
        )?;
        let (ty, out, beta) = match out {
            AttnOut::F32 { ptr, beta } => (GemmType::Bf16, ptr, beta),
            AttnOut::Bf16(ptr) => (GemmType::Bf16Out, ptr, 0.0),
        };
        let Some(o_lat) = o_lat else {
            let (pp, lp, wuv) = (part.ptr(), lse.ptr(), w.w_uv.w.ptr());
            let bf16 = ty == GemmType::Bf16Out;
            return gpu.mla_combine_uv(dims, pp, lp, splits, wuv, out, bf16, beta);
        };
        gpu.gemm(&Gemm {
            m: t,
            n: v,
            k: l,
            ty,
            x: o_lat.ptr(),
            ldx: n * l,
            stride_x: l,
            w: w.w_uv.w.ptr(),
            ldw: l,
            stride_w: v * l,
            out,
            ldo: n * v,
            stride_o: v,
            batch: n,
            beta,
        })
    }

    /// GLM-5 DSA: cache this step's index keys; per token with position >= index_topk, the
    /// selected positions (ascending), else None (dense).
    #[allow(clippy::too_many_arguments)]
    fn dsa_select(
        &self,
        li: usize,
        iw: &crate::weights::GIndexer,
        ic: &mlaserve_model::IndexerConfig,
        batch: &ForwardBatch,
        inp: &StepInputs,
        hnb: &DBuf<u16>,
        qcb: &DBuf<u16>,
        icache: &DBuf<f32>,
        cache: &GpuCache,
    ) -> Result<Vec<Option<Vec<usize>>>> {
        let gpu = &self.gpu;
        let cfg = self.model.config();
        let t = batch.num_tokens();
        let (hi, d, r) = (ic.num_heads, ic.head_dim, cfg.qk_rope_head_dim);
        let iq = gpu.alloc::<f32>(t * hi * d)?;
        linear(gpu, t, qcb.ptr(), &iw.wq_b, iq.ptr(), false)?;
        let ik = gpu.alloc::<f32>(t * d)?;
        linear(gpu, t, hnb.ptr(), &iw.wk, ik.ptr(), false)?;
        let wt = gpu.alloc::<f32>(t * hi)?;
        linear(gpu, t, hnb.ptr(), &iw.proj, wt.ptr(), false)?;
        gpu.layer_norm(
            t,
            ik.ptr(),
            d,
            iw.k_norm_w.ptr(),
            iw.k_norm_b.ptr(),
            d,
            1e-6,
        )?;
        gpu.rope(t, ik.ptr(), d, 1, 0, 0, r, inp.cos.ptr(), inp.sin.ptr())?;
        gpu.rope(
            t,
            iq.ptr(),
            hi * d,
            hi,
            d,
            0,
            r,
            inp.cos.ptr(),
            inp.sin.ptr(),
        )?;
        let layer_icache = icache.at(li * cache.slots() * d);
        gpu.cache_write_f32(t, ik.ptr(), d, inp.slots.ptr(), layer_icache, d)?;
        let n_keys: Vec<i32> = batch
            .positions
            .iter()
            .map(|&p| if p < ic.topk { 0 } else { p as i32 + 1 })
            .collect();
        let max_keys = n_keys.iter().copied().max().unwrap_or(0) as usize;
        if max_keys == 0 {
            return Ok(vec![None; t]);
        }
        let n_keys_d = gpu.upload(&n_keys)?;
        let scores = gpu.alloc::<f32>(t * max_keys)?;
        gpu.dsa_scores(
            t,
            iq.ptr(),
            wt.ptr(),
            layer_icache,
            scores.ptr(),
            n_keys_d.ptr(),
            inp.block_tables.ptr(),
            inp.bt_off.ptr(),
            batch.block_size,
            hi,
            d,
            max_keys,
        )?;
        let scores = gpu.to_host(&scores)?;
        Ok((0..t)
            .map(|ti| {
                let nk = n_keys[ti] as usize;
                (nk > 0).then(|| top_k(&scores[ti * max_keys..ti * max_keys + nk], ic.topk))
            })
            .collect())
    }
}
