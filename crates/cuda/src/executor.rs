//! `CudaExecutor`: the forward pass on one GPU, step for step the CPU reference's
//! (`mlaserve_model::Model::forward`), with the same batch contract and logits layout.
//!
//! Per layer, for T tokens (x [T, H] f32 residual, on the device):
//! 1. hn = RMSNorm(x) (f32 and bf16); q = q_b(RMSNorm(q_a(hn))) [T, N*(P+R)]; kv = kv_a(hn)
//!    [T, L+R]; RMSNorm on kv_c, RoPE on q_pe and k_pe; the row [kv_c | k_pe] written to the
//!    bf16 latent cache before attention (a token sees its own row on every path).
//! 2. DSA (GLM-5): indexer keys cached (f32), scores on the GPU, top-k on the host with the
//!    CPU's `top_k` (same tie rule), key lists uploaded.
//! 3. Unabsorbed sequences (prefill, chunked prefill): their positions 0..ctx+len gathered
//!    from the cache and decompressed by two GEMMs (w_uk, w_uv); one attention kernel over
//!    all of them. Absorbed sequences (decode): q_lat = W_UK·q_nope (batched GEMM over
//!    heads), split-context kernel over the paged cache + LSE combine, out = W_UV·o_lat.
//!    Each path sees zero keys for the other's tokens, so their outputs add.
//! 4. o_proj accumulates into x (GEMM beta = 1); the FFN likewise. MoE: routing with the
//!    CPU's rules, then expert GEMVs, a grouped GEMM or per-expert GEMMs by token count, and
//!    a deterministic weighted combine.
//!
//! Steps 1-3 past the attention norm are `executor/attention.rs`, the MoE FFN `executor/moe.rs`; this file holds the
//! step itself (inputs, CUDA graphs, logits and picks) and the dense layers.
//!
//! Invariant: every batch is validated against the cache before any device work, exactly as
//! the CPU executor does; a bad batch is an error, never an out-of-bounds write.

use crate::error::{CudaError, Result};
use crate::flash_attn::FaVariant;
use crate::gemv::{gemv_fits, GemvMat, GemvX};
use crate::gpu::{DBuf, Gpu};
use crate::graphs::{DecodeGraph, GraphKey, Graphs};
use crate::nccl::NcclComm;
use crate::ops::{AttnDims, Gemm, GemmType};
use crate::qgemv::PairCombine;
use crate::step_inputs::{HostInputs, KeyListHost, StepInputs};
use crate::weights::{GFfn, GLinear, GMat, GMlp, GWeights};
use mlaserve_model::layers::rope::Rope;
use mlaserve_model::probe::{self, PathTag};
use mlaserve_model::{
    AttentionPath, Executor, ForwardBatch, Model, ModelConfig, ModelError, RowArgmax, RowDraw,
    RowPick,
};
use std::sync::Arc;

/// Batches of at most this many tokens route on the GPU and run the experts as GEMVs over
/// (token, slot) pairs; larger ones gather rows per expert for cuBLAS GEMMs (each active
/// expert's weights read once).
/// Most splits of one query's key list in the absorbed decode kernel.
const MQA_MAX_SPLITS: usize = 16;

/// The bf16 latent cache (and f32 DSA index keys) of every layer.
struct GpuCache {
    /// [layers, slots, L+R] bf16
    latent: DBuf<u16>,
    /// [layers, slots, D] f32 (GLM-5 only)
    index: Option<DBuf<f32>>,
    num_blocks: usize,
    block_size: usize,
}

impl GpuCache {
    fn slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
}

/// A model on one GPU.
pub struct CudaExecutor {
    model: Arc<Model>,
    gpu: Gpu,
    w: GWeights,
    rope: Rope,
    cache: Option<GpuCache>,
    /// Tensor parallel: this rank's communicator (the model holds the rank's shard).
    comm: Option<NcclComm>,
    /// Dense unabsorbed attention on this tensor-core kernel (flash_attn.rs): sm_80+, head
    /// dims it holds, and not turned off by `MLASERVE_FLASH_ATTN=0`; the wgmma kernel on
    /// sm_90a unless `MLASERVE_WGMMA_PREFILL=0` ([`FaVariant::choose`]).
    flash: Option<FaVariant>,
    /// Captured decode steps (graphs.rs).
    graphs: Graphs,
    /// Most tokens for which every MoE layer routes and runs its experts on the GPU
    /// (usize::MAX without MoE layers); a decode graph needs that.
    moe_gpu_max: usize,
    /// Zeros that `moe_norm_route` counts its blocks in, a token each (and resets).
    route_tickets: DBuf<u32>,
    /// The logits of steps [`Executor::forward_picks`] picks on the host, kept (memory
    /// already faulted in, as the engine keeps its logits buffer).
    host_logits: Vec<f32>,
}

/// A step's logits on the device (in the step arena): `[rows, vocab]` f32, and
/// [`PICK_WORDS`] u32 a row of room for their picks ([`Gpu::logits_pick`]).
struct DevLogits {
    rows: usize,
    logits: DBuf<f32>,
    picks: DBuf<u32>,
}

/// The room a logits row's pick takes on the device, in u32: `[rows, 4]` RowArgmax words,
/// then `[rows]` picked tokens (read back together), then `[rows, 8]` draws (written).
const PICK_WORDS: usize = 13;

/// Whether a step with rows handed back whole ([`RowDraw::Whole`]) picks the other rows on
/// the device and copies only the whole rows (default; checked against the host's picks on an
/// H200 in session 31: bench/cuda/v2lite.md), or copies every row and picks on the host
/// (`MLASERVE_PICK_WHOLE_ROWS=0`; the engine then takes such steps' logits whole:
/// `Executor::picks_whole_rows`).
fn pick_whole_rows() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_PICK_WHOLE_ROWS").map_or(true, |v| v != "0"))
}

/// The draws as [`Gpu::logits_pick`] reads them, `[rows, 8]` u32; empty when every row is
/// greedy (the kernel then reads none).
pub fn draw_words(draws: &[RowDraw]) -> Vec<u32> {
    if draws
        .iter()
        .all(|d| matches!(d, RowDraw::Argmax | RowDraw::Whole))
    {
        return Vec::new();
    }
    draws
        .iter()
        .flat_map(|d| match *d {
            RowDraw::Argmax | RowDraw::Whole => [0; 8],
            RowDraw::Softmax {
                inv_temperature,
                random,
                filter,
            } => [
                inv_temperature.to_bits(),
                random as u32,
                (random >> 32) as u32,
                1,
                filter.top_k,
                filter.top_p.to_bits(),
                filter.min_p.to_bits(),
                0,
            ],
        })
        .collect()
}

/// Where a step's logits go.
enum Sink<'a> {
    /// Whole, into the caller's buffer ([`Executor::forward_into`]).
    Host(&'a mut Vec<f32>),
    /// Each row's token under its draw, picked on the device, and the rows whose draw is
    /// `Whole` copied ([`Executor::forward_picks`]).
    Picks(&'a [RowDraw], &'a mut Vec<RowPick>, &'a mut Vec<f32>),
}

/// Whether a product of M rows with bf16 weights `w` takes the in-house GEMV (gemv.rs) rather
/// than cuBLAS: M <= [`DENSE_GEMV_MAX_M`] and x fits its shared memory; matrices of 65,536 rows
/// or more (the lm_head) at M = 1 only, where the GEMV streams at the read ceiling (session 44,
/// an H100: V2-Lite's lm_head 145.2 -> 133.6 µs in the profile, the b1 step −5.5 µs) and
/// cuBLAS did not (at M = 2 the GEMV is not measured against it there).
/// `MLASERVE_DENSE_GEMV=0`: always cuBLAS; `=N`: up to N rows (comparisons);
/// `MLASERVE_LM_HEAD_GEMV=0`: cuBLAS for those large matrices at every M (comparisons).
fn dense_gemv(m: usize, w: &GMat) -> bool {
    static MAX_M: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    static LARGE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let max_m = *MAX_M.get_or_init(|| match std::env::var("MLASERVE_DENSE_GEMV").as_deref() {
        Ok("0") => 0,
        Ok(v) => v.parse().unwrap_or(DENSE_GEMV_MAX_M),
        Err(_) => DENSE_GEMV_MAX_M,
    });
    let large =
        *LARGE.get_or_init(|| std::env::var("MLASERVE_LM_HEAD_GEMV").map_or(true, |v| v != "0"));
    m <= max_m && gemv_fits(m, w.cols) && (w.rows < 65_536 || (large && m == 1))
}

/// Most rows on the decode GEMV: V2-Lite bf16 decode (session 7, bench/cuda/v2lite.md) was
/// 6% faster with it at 1 token, even at 2, and 4% slower at 4 than with cuBLAS.
const DENSE_GEMV_MAX_M: usize = 2;

/// Whether a step of `t` tokens computes the attention norm inside its first GEMV: q_a (or
/// q_proj) and kv_a both bf16 and on the GEMV ([`dense_gemv`]), or, at one token (unless
/// `MLASERVE_QMV_NORM=0`), q_a (or q_proj) quantized and on the one-vector int8 GEMV with a
/// norm twin ([`Gpu::qmv_norm_fits`]; kv_a then reads the hnb it leaves).
fn fused_attn_norm(gpu: &Gpu, w: &crate::weights::GMla, t: usize) -> Result<bool> {
    let q_in = w.q_a.as_ref().unwrap_or(&w.q_b);
    Ok(match (q_in, &w.kv_a) {
        (GLinear::Bf16(a), GLinear::Bf16(b)) => {
            a.cols == b.cols && dense_gemv(t, a) && dense_gemv(t, b)
        }
        (GLinear::Quant(a), _) => t == 1 && quant_norm_allowed() && gpu.qmv_norm_fits(a, None)?,
        _ => false,
    })
}

/// `MLASERVE_QMV_NORM=0` (read once) keeps the attention norm of a one-token quantized step
/// in a launch of its own (`rms_norm`) instead of inside the q_a / q_proj product
/// (`qmv_*_norm`, [`Gpu::qmv_norm`]; bit for bit the same hnb and output). On by default since
/// session 45: the Q4_K V2-Lite b1 step 1,615.1 -> 1,489.1 µs on an H100 (bench/cuda/v2lite.md).
fn quant_norm_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_NORM").as_deref() != Ok("0"))
}

/// Where the attention norm runs inside the quantized q_a / q_proj GEMV, kv_a in the same
/// launch (a quantized kv_a of the same type and width: [`Gpu::qmv_norm`]'s second matrix)
/// instead of a launch of its own reading hnb; the same bits either way. V2-Lite b1 on an
/// H100 (session 47, bench/cuda/v2lite.md): Q4_K 1,405 -> 1,373 µs, Q8_0 1,646 -> 1,615.
/// `MLASERVE_QMV_NORM_KV=0` (read once): kv_a in a launch of its own, for comparisons.
pub(crate) fn quant_norm_kv_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_NORM_KV").as_deref() != Ok("0"))
}

/// out[m, rows] (+)= x[m, cols] . W^T, x bf16, out f32: for bf16 weights the in-house GEMV
/// at M <= 4 ([`dense_gemv`]), else cuBLAS; the quantized kernels (qgemv.rs) for weights kept
/// in GGUF blocks.
fn linear(gpu: &Gpu, m: usize, x: u64, w: &GLinear, out: u64, acc: bool) -> Result<()> {
    match w {
        GLinear::Bf16(w) if dense_gemv(m, w) => {
            let mat = GemvMat {
                w: w.w.ptr(),
                rows: w.rows,
                out,
                ld: w.rows,
            };
            gpu.gemv_bf16(m, w.cols, GemvX::Bf16(x), &[mat], acc)
        }
        GLinear::Bf16(w) => {
            let g = Gemm::plain(GemmType::Bf16, m, w.rows, w.cols, x, w.w.ptr(), out);
            gpu.gemm(&if acc { g.accumulate() } else { g })
        }
        GLinear::Quant(q) => gpu.qgemm(q, m, x, out, acc),
    }
}

mod attention;
mod moe;
use moe::{moe_gpu_max_tokens, FfnIn};

impl CudaExecutor {
    /// Puts `model` on GPU `ordinal`: opens the device, compiles the kernels, uploads the
    /// weights in bf16. A host without a driver gets `CudaError::Unavailable`.
    pub fn new(model: Arc<Model>, ordinal: usize) -> Result<Self> {
        Self::on(model, Gpu::new(ordinal)?, None)
    }

    /// `model` (whole, or one rank's shard with its `comm`) on an opened `gpu`.
    pub fn on(model: Arc<Model>, gpu: Gpu, comm: Option<NcclComm>) -> Result<Self> {
        let ordinal = gpu.ordinal;
        let t0 = std::time::Instant::now();
        let w = GWeights::upload(&gpu, model.weights())?;
        gpu.sync()?;
        let (free, total) = gpu.mem_info()?;
        let (qb, lb) = w.linear_bytes();
        if qb > 0 {
            gpu.reserve_dequant_scratch()?;
        }
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        tracing::info!(
            "weights on cuda:{ordinal} in {:.2}s (projections {:.2} GiB, {:.2} GiB of it in \
             GGUF blocks); {:.1} of {:.1} GiB free",
            t0.elapsed().as_secs_f64(),
            gib(lb),
            gib(qb),
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
        let cfg = model.config();
        let rope = Rope::new(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.yarn.as_ref());
        let qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim;
        let moe_gpu_max = w
            .layers
            .iter()
            .map(|l| match &l.ffn {
                GFfn::Moe(m) => moe_gpu_max_tokens(&gpu, m, cfg),
                GFfn::Dense(_) => usize::MAX,
            })
            .min()
            .unwrap_or(usize::MAX);
        let wgmma_prefill = std::env::var("MLASERVE_WGMMA_PREFILL").map_or(true, |v| v != "0");
        // The wgmma kernel where it runs, else the mma.sync one of the same widths.
        let fits = |f: &FaVariant| gpu.has_flash_attn() && f.smem_bytes() <= gpu.max_smem_per_block;
        let flash = if std::env::var("MLASERVE_FLASH_ATTN").map_or(true, |v| v != "0") {
            FaVariant::choose(qk, cfg.v_head_dim, gpu.arch, wgmma_prefill)
                .filter(fits)
                .or_else(|| FaVariant::for_dims(qk, cfg.v_head_dim).filter(fits))
        } else {
            None
        };
        let route_tickets = gpu.upload(&[0u32; 64])?;
        Ok(Self {
            model,
            gpu,
            w,
            rope,
            cache: None,
            comm,
            flash,
            graphs: Graphs::new(),
            moe_gpu_max,
            route_tickets,
            host_logits: Vec::new(),
        })
    }

    /// Where a sublayer's [T, H] output goes: straight into the residual x, or (tensor
    /// parallel) a zeroed partial that [`Self::finish_partial`] sums over the ranks and adds.
    fn partial(&self, x: &DBuf<f32>) -> Result<Option<DBuf<f32>>> {
        match &self.comm {
            Some(_) => Ok(Some(self.gpu.alloc_filled::<f32>(x.len(), 0)?)),
            None => Ok(None),
        }
    }

    fn finish_partial(&self, x: &DBuf<f32>, part: Option<DBuf<f32>>) -> Result<()> {
        if let (Some(p), Some(c)) = (part, &self.comm) {
            c.all_reduce_sum(&self.gpu, p.ptr(), p.len())?;
            self.gpu.add(x.ptr(), p.ptr(), x.len())?;
        }
        Ok(())
    }

    /// A probe of device data (f32, `rows` rows of `width` at row stride `stride`); costs a
    /// copy to the host only while probes are on (`--trace`, `--dump`, doctor).
    #[allow(clippy::too_many_arguments)]
    fn probe_dev(
        &self,
        layer: Option<usize>,
        name: &str,
        tag: PathTag,
        shape: &[usize],
        ptr: u64,
        rows: usize,
        width: usize,
        stride: usize,
    ) -> Result<()> {
        if !probe::active() {
            return Ok(());
        }
        let all = self
            .gpu
            .read_f32_at(ptr, rows.saturating_sub(1) * stride + width)?;
        let data: Vec<f32> = (0..rows)
            .flat_map(|r| all[r * stride..r * stride + width].iter().copied())
            .collect();
        probe::probe(layer, name, tag, shape, &data);
        Ok(())
    }

    /// Joins a tensor-parallel group (the model must hold this rank's shard).
    pub fn set_comm(&mut self, comm: NcclComm) {
        self.comm = Some(comm);
    }

    /// Leaves the tensor-parallel group at once (after this rank failed).
    pub fn abort_comm(&mut self) {
        if let Some(c) = self.comm.take() {
            c.abort();
        }
    }

    /// Tensor-parallel rank of this executor (0 when alone).
    pub fn rank(&self) -> usize {
        self.comm.as_ref().map_or(0, |c| c.rank)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Turns CUDA graphs for decode steps on or off (on unless `MLASERVE_CUDA_GRAPHS=0`);
    /// off drops the graphs kept.
    pub fn set_cuda_graphs(&mut self, on: bool) {
        self.graphs.enabled = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// One step with every kernel and GEMM timed on the GPU: (label, µs) in stream order, and
    /// whether the step ran as a graph. A decode step that can be graphed is captured with
    /// its profile events as graph nodes and replayed twice (the second replay is reported),
    /// so the times include graph scheduling but no host launch gaps; any other step runs
    /// eagerly, and its times include the gaps where the host launched slower than the GPU
    /// ran. The step's cache writes happen as in a normal step.
    pub fn profile_step(&mut self, batch: &ForwardBatch) -> Result<(Vec<(String, f64)>, bool)> {
        let num_blocks = self.cache.as_ref().map_or(0, |c| c.num_blocks);
        let block_size = self.cache.as_ref().map_or(0, |c| c.block_size);
        batch.check_against(num_blocks, block_size, self.model.config().vocab_size)?;
        self.gpu.begin_step();
        let h = self.host_inputs(batch);
        let graphed = self.graph_key(batch, &h).is_some();
        let run = || -> Result<()> {
            if graphed {
                let inputs = StepInputs::new(&self.gpu, &h, None)?;
                self.gpu.begin_capture()?;
                let body = self
                    .gpu
                    .prof_begin()
                    .and_then(|_| self.body(batch, &inputs));
                let graph = self.gpu.end_capture();
                body?;
                let graph = graph?;
                for _ in 0..2 {
                    graph
                        .launch()
                        .map_err(|e| CudaError::driver("launching a decode graph", e))?;
                }
                Ok(())
            } else {
                let inputs = StepInputs::new(&self.gpu, &h, None)?;
                self.gpu.prof_begin()?;
                self.body(batch, &inputs).map(|_| ())
            }
        };
        let r = run();
        let prof = self.gpu.prof_take();
        self.gpu.end_step();
        r?;
        Ok((prof?, graphed))
    }

    /// `replays` replays of one decode step captured as a CUDA graph, each timed on the GPU
    /// (µs; events only between replays, so the kernels overlap as they do in serving, unlike
    /// [`CudaExecutor::profile_step`]'s). For the timing labs; a step that cannot be graphed
    /// is an error. Each replay writes the step's cache slots again.
    pub fn time_step(&mut self, batch: &ForwardBatch, replays: usize) -> Result<Vec<f64>> {
        let num_blocks = self.cache.as_ref().map_or(0, |c| c.num_blocks);
        let block_size = self.cache.as_ref().map_or(0, |c| c.block_size);
        batch.check_against(num_blocks, block_size, self.model.config().vocab_size)?;
        self.gpu.begin_step();
        let h = self.host_inputs(batch);
        let run = || -> Result<Vec<f64>> {
            if self.graph_key(batch, &h).is_none() {
                return Err(CudaError::Invalid(
                    "time_step: this step is not one a CUDA graph can run".into(),
                ));
            }
            let inputs = StepInputs::new(&self.gpu, &h, None)?;
            self.gpu.begin_capture()?;
            let body = self.body(batch, &inputs);
            let graph = self.gpu.end_capture();
            body?;
            let graph = graph?;
            let launch = || {
                graph
                    .launch()
                    .map_err(|e| CudaError::driver("launching a decode graph", e))
            };
            launch()?; // warm-up
            let event = || {
                let e = self
                    .gpu
                    .ctx
                    .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(|e| CudaError::driver("a timing event", e))?;
                e.record(&self.gpu.stream)
                    .map_err(|e| CudaError::driver("recording a timing event", e))?;
                Ok::<_, CudaError>(e)
            };
            let mut marks = vec![event()?];
            for _ in 0..replays {
                launch()?;
                marks.push(event()?);
            }
            self.gpu.sync()?;
            marks
                .windows(2)
                .map(|w| {
                    w[0].elapsed_ms(&w[1])
                        .map(|ms| ms as f64 * 1e3)
                        .map_err(|e| CudaError::driver("a timing event's time", e))
                })
                .collect()
        };
        let r = run();
        self.gpu.end_step();
        r
    }

    /// Decode shapes captured as CUDA graphs so far.
    pub fn cuda_graphs(&self) -> usize {
        self.graphs.len()
    }

    fn host_inputs(&self, batch: &ForwardBatch) -> HostInputs {
        let t = batch.num_tokens();
        let half = self.model.config().qk_rope_head_dim / 2;
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for &p in &batch.positions {
            let (c, s) = self.rope.cos_sin(p);
            cos.extend(c);
            sin.extend(s);
        }
        let mut tables = Vec::new();
        let mut bt_off = Vec::with_capacity(t);
        for (s, seq) in batch.seqs.iter().enumerate() {
            let off = tables.len() as i32;
            tables.extend(seq.block_table.iter().map(|&b| b as i32));
            for _ in batch.seq_starts[s]..batch.seq_starts[s + 1] {
                bt_off.push(off);
            }
        }
        HostInputs {
            dense: KeyListHost::build(batch, &vec![None; t], self.flash),
            tokens: batch.tokens.clone(),
            slots: batch.slot_mapping.iter().map(|&s| s as i64).collect(),
            cos,
            sin,
            block_tables: tables,
            bt_off,
            logit_rows: batch.logits_indices().iter().map(|&i| i as i32).collect(),
        }
    }

    /// The graph shape of this step, if it can be replayed from a CUDA graph (graphs.rs).
    fn graph_key(&self, batch: &ForwardBatch, h: &HostInputs) -> Option<GraphKey> {
        let cfg = self.model.config();
        let t = batch.num_tokens();
        let moe = cfg.moe.is_some();
        if !self.graphs.enabled
            || self.comm.is_some()
            || probe::active()
            || cfg
                .indexer
                .as_ref()
                .is_some_and(|ic| batch.positions.iter().any(|&p| p >= ic.topk))
            || !batch.is_decode.iter().all(|&d| d)
            || h.logit_rows.len() != t
            || (moe && t > self.moe_gpu_max)
        {
            return None;
        }
        let heads = self.w.layers.first()?.mla.num_heads;
        let splits = self
            .gpu
            .mqa_tc_splits(t, heads, h.dense.max_mqa(), MQA_MAX_SPLITS)
            .ok()?;
        let dims = AttnDims {
            t,
            heads,
            p: cfg.qk_nope_head_dim,
            r: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
            l: cfg.kv_lora_rank,
            scale: cfg.softmax_scale(),
        };
        let cluster_attn = self.gpu.mla_attn_cluster_picked(&dims, h.dense.max_mqa());
        let key = GraphKey {
            tokens: t,
            splits,
            cluster_attn,
        };
        (!self.graphs.refused(&key)).then_some(key)
    }

    /// One step inside the step arena, into `sink`. The arena step ends even if the step
    /// panics (the engine catches panics and keeps serving; a step left open would hand arena
    /// views to init_cache).
    fn step_into(
        &mut self,
        batch: &ForwardBatch,
        sink: &mut Sink,
    ) -> std::result::Result<(), ModelError> {
        self.gpu.begin_step();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(batch, sink)));
        self.gpu.end_step();
        match r {
            Ok(r) => Ok(r?),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// A decode step from its graph: captured on first sight of its shape, replayed after.
    fn step_graph(
        &mut self,
        batch: &ForwardBatch,
        h: &HostInputs,
        key: GraphKey,
        sink: &mut Sink,
    ) -> Result<()> {
        let rows = h.logit_rows.len();
        if let Some(mut g) = self.graphs.take(&key) {
            if g.inputs.fits(h) {
                let r = g.inputs.write(&self.gpu, h).and_then(|_| {
                    g.graph
                        .launch()
                        .map_err(|e| CudaError::driver("launching a decode graph", e))?;
                    self.deliver(g.logits, g.picks, rows, sink)
                });
                self.graphs.put(key, g);
                return r;
            }
            // The block tables outgrew the graph's buffer: capture again with room to grow.
        }
        // Block tables get twice what this step needs (a power of two), not the whole cache:
        // a graph of 256 tokens over a 200k-block cache would otherwise hold 200 MB.
        let cap = (2 * h.block_tables.len()).next_power_of_two().max(4);
        let inputs = StepInputs::new(&self.gpu, h, Some(cap))?;
        self.gpu.begin_capture()?;
        let body = self.body(batch, &inputs);
        let graph = self.gpu.end_capture();
        match (body, graph) {
            (Ok(Some(dev)), Ok(graph)) => {
                graph
                    .launch()
                    .map_err(|e| CudaError::driver("launching a decode graph", e))?;
                let (logits, picks) = (dev.logits.ptr(), dev.picks.ptr());
                self.deliver(logits, picks, rows, sink)?;
                self.graphs.put(
                    key,
                    DecodeGraph {
                        graph,
                        inputs,
                        logits,
                        picks,
                    },
                );
                tracing::debug!("captured decode graph {key:?} ({} kept)", self.graphs.len());
                Ok(())
            }
            (body, graph) => {
                let why = match (body, graph) {
                    (Err(e), _) | (_, Err(e)) => e.to_string(),
                    _ => "no logits".to_string(),
                };
                tracing::warn!(
                    "decode steps of {} tokens ({} splits) run without a CUDA graph: capture failed: {why}",
                    key.tokens,
                    key.splits
                );
                self.graphs.refuse(key);
                let inputs = StepInputs::new(&self.gpu, h, None)?;
                let logits = self.body(batch, &inputs)?;
                self.logits_to_host(logits, sink)
            }
        }
    }

    fn step(&mut self, batch: &ForwardBatch, sink: &mut Sink) -> Result<()> {
        let cache = self.cache.as_ref().ok_or_else(|| {
            CudaError::Model(ModelError::Batch(
                "forward before init_cache: no latent cache".into(),
            ))
        })?;
        batch.check_against(
            cache.num_blocks,
            cache.block_size,
            self.model.config().vocab_size,
        )?;
        probe::begin_step(&batch.positions);
        let h = self.host_inputs(batch);
        let r = match self.graph_key(batch, &h) {
            Some(key) => self.step_graph(batch, &h, key, sink),
            None => StepInputs::new(&self.gpu, &h, None)
                .and_then(|inp| self.body(batch, &inp))
                .and_then(|logits| self.logits_to_host(logits, sink)),
        };
        probe::end_step().map_err(|e| CudaError::Invalid(format!("--dump: {e}")))?;
        r
    }

    /// Device logits (or none: no row wants them, or not rank 0) to the host, into `sink`.
    fn logits_to_host(&self, dev: Option<DevLogits>, sink: &mut Sink) -> Result<()> {
        let Some(dev) = dev else {
            self.gpu.sync()?;
            match sink {
                Sink::Host(out) => out.clear(),
                Sink::Picks(_, out, whole) => {
                    out.clear();
                    whole.clear();
                }
            }
            return Ok(());
        };
        self.deliver(dev.logits.ptr(), dev.picks.ptr(), dev.rows, sink)?;
        if let Sink::Host(out) = sink {
            let vocab = self.model.config().vocab_size;
            probe::probe(
                None,
                "logits",
                PathTag::None,
                &[out.len() / vocab, vocab],
                out,
            );
        }
        Ok(())
    }

    /// `rows` logits rows at `logits` into `sink`: copied whole, or each reduced on the device
    /// to its pick (in the step's room at `picks`, [`PICK_WORDS`] u32 a row) and those copied,
    /// with the rows whose draw is `Whole` (a copy a run of them).
    fn deliver(&self, logits: u64, picks: u64, rows: usize, sink: &mut Sink) -> Result<()> {
        let vocab = self.model.config().vocab_size;
        match sink {
            Sink::Host(out) => self.gpu.read_f32_into(logits, rows * vocab, out),
            Sink::Picks(draws, out, whole) => {
                out.clear();
                if draws.len() != rows {
                    return Err(CudaError::Invalid(format!(
                        "{} draws for a step of {rows} logits rows",
                        draws.len()
                    )));
                }
                if rows == 0 {
                    return self.gpu.sync();
                }
                // the kernel's weights need p in [0, 1]
                if let Some(e) = draws.iter().find_map(|d| d.check().err()) {
                    return Err(CudaError::Invalid(e));
                }
                let (argmax, picked, at) =
                    (picks, picks + 16 * rows as u64, picks + 20 * rows as u64);
                let words = draw_words(draws);
                let draws_at = if words.is_empty() { 0 } else { at };
                self.gpu.write_u32_at(at, &words)?;
                self.gpu
                    .logits_pick(rows, logits, vocab, draws_at, argmax, picked)?;
                let mut back = vec![0u32; rows * 5];
                self.gpu.read_u32_into(argmax, &mut back)?;
                let (words, tokens) = back.split_at(rows * 4);
                out.extend(
                    words
                        .chunks_exact(4)
                        .zip(tokens)
                        .map(|(w, &token_id)| RowPick {
                            argmax: RowArgmax {
                                token_id: w[0],
                                max: f32::from_bits(w[1]),
                                first_bad: (w[2] != u32::MAX).then(|| (w[2], f32::from_bits(w[3]))),
                            },
                            token_id,
                        }),
                );
                let len = draws.iter().filter(|&&d| d == RowDraw::Whole).count() * vocab;
                if whole.capacity() < len {
                    **whole = vec![0.0; len]; // zeroed pages from the allocator, not a fill
                } else {
                    whole.resize(len, 0.0); // kept memory: fills only past its last length
                }
                let (mut r, mut k) = (0, 0);
                while r < rows {
                    let run = draws[r..]
                        .iter()
                        .take_while(|&&d| d == RowDraw::Whole)
                        .count();
                    if run == 0 {
                        r += 1;
                        continue;
                    }
                    let at = logits + (r * vocab * 4) as u64;
                    self.gpu
                        .read_f32_slice(at, &mut whole[k * vocab..(k + run) * vocab])?;
                    (r, k) = (r + run, k + run);
                }
                Ok(())
            }
        }
    }

    /// The step's work on the stream, from the embedding to the logits [rows, vocab] f32 of
    /// `inp.logit_rows` (None when no row wants logits or on ranks other than 0). Reads
    /// nothing back to the host, so it can be captured into a CUDA graph (decode steps).
    fn body(&self, batch: &ForwardBatch, inp: &StepInputs) -> Result<Option<DevLogits>> {
        let cache = self.cache.as_ref().ok_or_else(|| {
            CudaError::Model(ModelError::Batch(
                "forward before init_cache: no latent cache".into(),
            ))
        })?;
        let cfg = self.model.config();
        let gpu = &self.gpu;
        let (t, h) = (batch.num_tokens(), cfg.hidden_size);
        let x = gpu.alloc::<f32>(t * h)?;
        gpu.embed(&self.w.embed.w, &inp.tokens, x.ptr(), h)?;
        let hn = gpu.alloc::<f32>(t * h)?;
        let hnb = gpu.alloc::<u16>(t * h)?;
        for (li, layer) in self.w.layers.iter().enumerate() {
            // Small decode steps with bf16 projections, and one-token steps with a quantized
            // q_a / q_proj: the attention's first GEMV normalizes x itself (and still leaves
            // hnb for kv_a and the indexer); else the norm kernel.
            let fused_norm = !probe::active() && fused_attn_norm(gpu, &layer.mla, t)?;
            if !fused_norm {
                gpu.rms_norm(
                    t,
                    x.ptr(),
                    h,
                    0,
                    layer.attn_norm.ptr(),
                    hn.ptr(),
                    h,
                    hnb.ptr(),
                    h,
                    h,
                    cfg.rms_norm_eps,
                )?;
                self.probe_dev(
                    Some(li),
                    "attn_norm",
                    PathTag::None,
                    &[t, h],
                    hn.ptr(),
                    t,
                    h,
                    h,
                )?;
            }
            let part = self.partial(&x)?;
            let target = part.as_ref().map_or(x.ptr(), |p| p.ptr());
            let norm_in = fused_norm.then(|| GemvX::Norm {
                x: x.ptr(),
                gamma: layer.attn_norm.ptr(),
                eps: cfg.rms_norm_eps,
                hnb: hnb.ptr(),
            });
            self.attention(li, layer, batch, inp, cache, &hnb, norm_in, target)?;
            self.finish_partial(&x, part)?;
            // Small MoE steps: the routing kernel normalizes x itself (and writes hnb).
            let fused_route = matches!(layer.ffn, GFfn::Moe(_)) && self.fused_route(t);
            if !fused_route {
                gpu.rms_norm(
                    t,
                    x.ptr(),
                    h,
                    0,
                    layer.ffn_norm.ptr(),
                    hn.ptr(),
                    h,
                    hnb.ptr(),
                    h,
                    h,
                    cfg.rms_norm_eps,
                )?;
            }
            let part = self.partial(&x)?;
            let target = part.as_ref().map_or(x.ptr(), |p| p.ptr());
            let ffn_in = match fused_route {
                true => FfnIn::Residual {
                    x: x.ptr(),
                    gamma: layer.ffn_norm.ptr(),
                },
                false => FfnIn::Normed(&hn),
            };
            match &layer.ffn {
                GFfn::Dense(m) => self.mlp(m, t, hnb.ptr(), target, None)?,
                GFfn::Moe(m) => self.moe(m, t, ffn_in, &hnb, target)?,
            }
            self.finish_partial(&x, part)?;
            self.probe_dev(Some(li), "out", PathTag::None, &[t, h], x.ptr(), t, h, h)?;
        }
        self.logits(inp, &x)
    }

    /// Final norm and lm_head for the rows that want logits (rank 0 only), on the device.
    fn logits(&self, inp: &StepInputs, x: &DBuf<f32>) -> Result<Option<DevLogits>> {
        let gpu = &self.gpu;
        let cfg = self.model.config();
        let (h, rows) = (cfg.hidden_size, inp.n_logits);
        if rows == 0 || self.rank() != 0 {
            return Ok(None);
        }
        let last = gpu.alloc::<u16>(rows * h)?;
        gpu.rms_norm(
            rows,
            x.ptr(),
            h,
            inp.logit_rows.ptr(),
            self.w.output_norm.ptr(),
            0,
            0,
            last.ptr(),
            h,
            h,
            cfg.rms_norm_eps,
        )?;
        let logits = gpu.alloc::<f32>(rows * cfg.vocab_size)?;
        linear(gpu, rows, last.ptr(), &self.w.lm_head, logits.ptr(), false)?;
        let picks = gpu.alloc::<u32>(rows * PICK_WORDS)?;
        Ok(Some(DevLogits {
            rows,
            logits,
            picks,
        }))
    }

    /// SwiGLU MLP on bf16 rows xb [m, H], accumulated into out [m, H]; `comb`: the routed
    /// experts' pending sum, added into out before the product (in a quantized down
    /// projection's epilogue where it takes the int8 GEMV: one launch fewer).
    fn mlp(
        &self,
        m: &GMlp,
        rows: usize,
        xb: u64,
        out: u64,
        comb: Option<PairCombine>,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let act = gpu.alloc::<u16>(rows * m.f)?;
        // One quantized row: the SwiGLU in the int8 GEMV's epilogue (the same sums and bits).
        let fused = match &m.gate_up {
            GLinear::Quant(q) if q.rows == 2 * m.f => gpu.qgemm_glu(q, rows, xb, act.ptr())?,
            _ => false,
        };
        if !fused {
            let gu = gpu.alloc::<f32>(rows * 2 * m.f)?;
            linear(gpu, rows, xb, &m.gate_up, gu.ptr(), false)?;
            gpu.silu_mul(gu.ptr(), act.ptr(), m.f, rows)?;
        }
        self.mlp_down(m, rows, act.ptr(), out, comb)
    }

    /// The down projection of [`CudaExecutor::mlp`] from its SwiGLU rows `act` [rows, F] bf16,
    /// added into `out` [rows, H] with the routed experts' pending combine `comb` first.
    fn mlp_down(
        &self,
        m: &GMlp,
        rows: usize,
        act: u64,
        out: u64,
        comb: Option<PairCombine>,
    ) -> Result<()> {
        let gpu = &self.gpu;
        if let Some(c) = comb {
            if let GLinear::Quant(q) = &m.down {
                if gpu.combine_fits(q, rows, c.k) {
                    return gpu.qmv_combine(q, act, out, c);
                }
            }
            gpu.moe_combine_pairs(rows, out, c.y, c.w, c.k, m.down.rows())?;
        }
        linear(gpu, rows, act, &m.down, out, true)
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        // The communicator goes first, while its context, stream and buffers are alive.
        self.comm.take();
    }
}

impl Executor for CudaExecutor {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn attention_path(&self) -> AttentionPath {
        self.model.options().attention_path
    }

    fn init_cache(
        &mut self,
        num_blocks: usize,
        block_size: usize,
    ) -> std::result::Result<(), ModelError> {
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::Batch(format!(
                "cache of {num_blocks} blocks of {block_size} slots"
            )));
        }
        self.cache = None; // free the old cache first
        self.graphs.clear(); // they hold the old cache's addresses
        let cfg = self.model.config();
        let slots = num_blocks * block_size;
        let layers = cfg.num_layers;
        let lw = cfg.kv_lora_rank + cfg.qk_rope_head_dim;
        let latent = self.gpu.alloc_filled::<u16>(layers * slots * lw, 0)?;
        let index = match &cfg.indexer {
            Some(ic) => Some(
                self.gpu
                    .alloc_filled::<f32>(layers * slots * ic.head_dim, 0)?,
            ),
            None => None,
        };
        self.cache = Some(GpuCache {
            latent,
            index,
            num_blocks,
            block_size,
        });
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> std::result::Result<Vec<f32>, ModelError> {
        let mut out = Vec::new();
        self.forward_into(batch, &mut out)?;
        Ok(out)
    }

    fn forward_into(
        &mut self,
        batch: &ForwardBatch,
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), ModelError> {
        self.step_into(batch, &mut Sink::Host(out))
    }

    fn forward_picks(
        &mut self,
        batch: &ForwardBatch,
        draws: &[RowDraw],
        out: &mut Vec<RowPick>,
        whole: &mut Vec<f32>,
    ) -> std::result::Result<(), ModelError> {
        let whole_rows = !pick_whole_rows() && draws.contains(&RowDraw::Whole);
        if probe::active() || whole_rows {
            // Probes and dumps see the logits as every other step shows them; steps with rows
            // handed back whole copy every row where pick_whole_rows is off.
            let mut logits = std::mem::take(&mut self.host_logits);
            let r = self.forward_into(batch, &mut logits).and_then(|_| {
                let vocab = self.model.config().vocab_size;
                mlaserve_model::draw::picks_of(&logits, vocab, draws, out, whole)
            });
            self.host_logits = logits;
            return r;
        }
        self.step_into(batch, &mut Sink::Picks(draws, out, whole))
    }

    fn picks_whole_rows(&self) -> bool {
        pick_whole_rows()
    }

    fn take_comm_seconds(&mut self) -> Option<f64> {
        self.comm.as_ref().map(|c| c.take_seconds())
    }

    fn device(&self) -> String {
        match &self.comm {
            Some(c) => format!(
                "cuda:{} ({}) rank {} of {}",
                self.gpu.ordinal, self.gpu.name, c.rank, c.world_size
            ),
            None => format!("cuda:{} ({})", self.gpu.ordinal, self.gpu.name),
        }
    }
}
