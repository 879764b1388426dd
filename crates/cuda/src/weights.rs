//! Weights on the GPU. Projections ([`GLinear`]) stay in their GGUF blocks where the type is
//! one the GPU computes on directly (Q8_0, Q4_K: qgemv.rs), unless `MLASERVE_GPU_WEIGHTS=bf16`;
//! every other matrix is bf16 (GGUF blocks dequantized on the host first), and the matrices
//! used in other ways than a product with activations (embedding rows, the per-head absorbed
//! W_UK / W_UV of strided-batched GEMMs) are always bf16. Norms, biases and the MoE router are
//! f32. Same names and shapes as `mlaserve_model::weights`; gate and up of each SwiGLU MLP are
//! stacked into one `gate_up` [2F, H] matrix so one product computes both.
//!
//! Invariant: the routed experts of one MoE layer share one [`GLinear`] kind per projection
//! (GGUF stores them as one tensor per projection), so one kernel serves every expert.

use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use crate::qgemv::{QMat, QType};
use mlaserve_backend::QMatrix;
use mlaserve_model::weights::{Ffn, IndexerWeights, Layer, MlaWeights, Mlp, Moe, Weights};
use rayon::prelude::*;

/// A bf16 matrix [rows, cols].
pub struct GMat {
    pub w: DBuf<u16>,
    pub rows: usize,
    pub cols: usize,
}

/// A projection's weights [rows, cols]: bf16, or GGUF blocks kept compressed.
pub enum GLinear {
    Bf16(GMat),
    Quant(QMat),
}

impl GLinear {
    pub fn rows(&self) -> usize {
        match self {
            GLinear::Bf16(m) => m.rows,
            GLinear::Quant(q) => q.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            GLinear::Bf16(m) => m.cols,
            GLinear::Quant(q) => q.cols,
        }
    }

    /// The device pointer of the weights (bf16 elements or quantized blocks).
    pub fn ptr(&self) -> u64 {
        match self {
            GLinear::Bf16(m) => m.w.ptr(),
            GLinear::Quant(q) => q.w.ptr(),
        }
    }

    /// The block type, None for bf16.
    pub fn qtype(&self) -> Option<QType> {
        match self {
            GLinear::Bf16(_) => None,
            GLinear::Quant(q) => Some(q.ty),
        }
    }

    /// Bytes the weights occupy on the device.
    pub fn bytes(&self) -> usize {
        match self {
            GLinear::Bf16(m) => m.rows * m.cols * 2,
            GLinear::Quant(q) => q.bytes(),
        }
    }
}

/// Whether quantized projections stay compressed (`MLASERVE_GPU_WEIGHTS`, default `native`).
fn native_weights() -> Result<bool> {
    match std::env::var("MLASERVE_GPU_WEIGHTS").as_deref() {
        Err(_) | Ok("native") | Ok("") => Ok(true),
        Ok("bf16") => Ok(false),
        Ok(v) => Err(CudaError::Invalid(format!(
            "MLASERVE_GPU_WEIGHTS={v}: expected `native` (Q8_0/Q4_K kept compressed) or `bf16`"
        ))),
    }
}

fn bf16_bits(x: &[f32]) -> Vec<u16> {
    x.par_iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

fn mat(gpu: &Gpu, m: &QMatrix) -> Result<GMat> {
    let w = if m.ty == mlaserve_gguf::GgmlType::BF16 {
        // Already bf16: the stored bytes go up as they are.
        gpu.upload_bytes(&m.data()[..m.rows * m.row_bytes()])?
    } else {
        gpu.upload(&bf16_bits(&m.to_f32()))?
    };
    Ok(GMat {
        w,
        rows: m.rows,
        cols: m.cols,
    })
}

/// The upload policy of one load.
#[derive(Clone, Copy)]
struct Up<'a> {
    gpu: &'a Gpu,
    native: bool,
}

impl Up<'_> {
    /// The block type `m` stays in on the device, if any.
    fn keeps(&self, m: &QMatrix) -> Option<QType> {
        QType::from_ggml(m.ty).filter(|t| self.native && m.cols % t.block_values() == 0)
    }

    fn linear(&self, m: &QMatrix) -> Result<GLinear> {
        match self.keeps(m) {
            Some(ty) => Ok(GLinear::Quant(self.gpu.upload_qmat(
                ty,
                m.rows,
                m.cols,
                &m.data()[..m.rows * m.row_bytes()],
            )?)),
            None => Ok(GLinear::Bf16(mat(self.gpu, m)?)),
        }
    }
}

fn vec32(gpu: &Gpu, v: &[f32]) -> Result<DBuf<f32>> {
    gpu.upload(v)
}

/// SwiGLU MLP: gate_up [2F, H], down [H, F].
pub struct GMlp {
    pub gate_up: GLinear,
    pub down: GLinear,
    pub f: usize,
}

fn mlp(up: Up, m: &Mlp) -> Result<GMlp> {
    let bf16 = mlaserve_gguf::GgmlType::BF16;
    let (g, u) = (
        m.gate.rows * m.gate.row_bytes(),
        m.up.rows * m.up.row_bytes(),
    );
    let stacked = || -> Vec<u8> {
        let mut bytes = Vec::with_capacity(g + u);
        bytes.extend_from_slice(&m.gate.data()[..g]);
        bytes.extend_from_slice(&m.up.data()[..u]);
        bytes
    };
    let (rows, cols) = (2 * m.gate.rows, m.gate.cols);
    let gate_up = match (up.keeps(&m.gate), up.keeps(&m.up)) {
        (Some(a), Some(b)) if a == b => {
            GLinear::Quant(up.gpu.upload_qmat(a, rows, cols, &stacked())?)
        }
        _ => {
            let w = if m.gate.ty == bf16 && m.up.ty == bf16 {
                up.gpu.upload_bytes(&stacked())?
            } else {
                let mut gu = m.gate.to_f32();
                gu.extend(m.up.to_f32());
                up.gpu.upload(&bf16_bits(&gu))?
            };
            GLinear::Bf16(GMat { w, rows, cols })
        }
    };
    Ok(GMlp {
        gate_up,
        down: up.linear(&m.down)?,
        f: m.gate.rows,
    })
}

pub struct GMoe {
    /// [E, H] f32 (router logits are computed in f32 like the CPU path).
    pub router: DBuf<f32>,
    pub num_experts: usize,
    /// `experts[i]` is routed expert `first_expert + i` (all of them unless expert-parallel).
    pub first_expert: usize,
    /// Selection-only bias, applied on the host where routing runs.
    pub correction_bias: Option<Vec<f32>>,
    pub experts: Vec<GMlp>,
    pub shared: Option<GMlp>,
    /// [experts.len()] device pointers of each held expert's gate_up / down (GEMV path).
    pub gate_up_ptrs: DBuf<u64>,
    pub down_ptrs: DBuf<u64>,
    /// The block type of every routed expert's gate_up / down (None: bf16).
    pub gate_up_ty: Option<QType>,
    pub down_ty: Option<QType>,
    /// The selection-only bias on the device (GPU routing), if any.
    pub bias_dev: Option<DBuf<f32>>,
}

pub enum GFfn {
    Dense(GMlp),
    Moe(GMoe),
}

pub struct GMla {
    /// Heads held: all, or this tensor-parallel rank's share.
    pub num_heads: usize,
    pub q_a: Option<GLinear>,
    pub q_a_norm: Option<DBuf<f32>>,
    pub q_b: GLinear,
    pub kv_a: GLinear,
    pub kv_a_norm: DBuf<f32>,
    /// [N*P, L]
    pub w_uk: GMat,
    /// [N*L, P]
    pub w_uk_t: GMat,
    /// [N*V, L]
    pub w_uv: GMat,
    pub o_proj: GLinear,
}

pub struct GIndexer {
    pub wq_b: GLinear,
    pub wk: GLinear,
    pub k_norm_w: DBuf<f32>,
    pub k_norm_b: DBuf<f32>,
    pub proj: GLinear,
}

pub struct GLayer {
    pub attn_norm: DBuf<f32>,
    pub mla: GMla,
    pub indexer: Option<GIndexer>,
    pub ffn_norm: DBuf<f32>,
    pub ffn: GFfn,
}

pub struct GWeights {
    pub embed: GMat,
    pub layers: Vec<GLayer>,
    pub output_norm: DBuf<f32>,
    pub lm_head: GLinear,
}

fn mla(up: Up, w: &MlaWeights) -> Result<GMla> {
    let gpu = up.gpu;
    Ok(GMla {
        num_heads: w.num_heads,
        q_a: w.q_a.as_ref().map(|m| up.linear(m)).transpose()?,
        q_a_norm: w.q_a_norm.as_ref().map(|v| vec32(gpu, v)).transpose()?,
        q_b: up.linear(&w.q_b)?,
        kv_a: up.linear(&w.kv_a)?,
        kv_a_norm: vec32(gpu, &w.kv_a_norm)?,
        w_uk: mat(gpu, &w.w_uk)?,
        w_uk_t: mat(gpu, &w.w_uk_t)?,
        w_uv: mat(gpu, &w.w_uv)?,
        o_proj: up.linear(&w.o_proj)?,
    })
}

fn indexer(up: Up, w: &IndexerWeights) -> Result<GIndexer> {
    Ok(GIndexer {
        wq_b: up.linear(&w.wq_b)?,
        wk: up.linear(&w.wk)?,
        k_norm_w: vec32(up.gpu, &w.k_norm_w)?,
        k_norm_b: vec32(up.gpu, &w.k_norm_b)?,
        proj: up.linear(&w.proj)?,
    })
}

fn moe(up: Up, m: &Moe) -> Result<GMoe> {
    let gpu = up.gpu;
    let experts: Vec<GMlp> = m
        .experts
        .iter()
        .map(|e| mlp(up, e))
        .collect::<Result<_>>()?;
    let kind = |f: fn(&GMlp) -> &GLinear| experts.first().and_then(|e| f(e).qtype());
    let (gate_up_ty, down_ty) = (kind(|e| &e.gate_up), kind(|e| &e.down));
    if experts
        .iter()
        .any(|e| e.gate_up.qtype() != gate_up_ty || e.down.qtype() != down_ty)
    {
        return Err(CudaError::Invalid(
            "routed experts of one layer stored in different block types".into(),
        ));
    }
    let gu: Vec<u64> = experts.iter().map(|e| e.gate_up.ptr()).collect();
    let dn: Vec<u64> = experts.iter().map(|e| e.down.ptr()).collect();
    Ok(GMoe {
        router: gpu.upload(&m.router.to_f32())?,
        num_experts: m.router.rows,
        first_expert: m.first_expert,
        correction_bias: m.correction_bias.clone(),
        bias_dev: m
            .correction_bias
            .as_ref()
            .map(|b| gpu.upload(b))
            .transpose()?,
        gate_up_ptrs: gpu.upload(&gu)?,
        down_ptrs: gpu.upload(&dn)?,
        gate_up_ty,
        down_ty,
        experts,
        shared: m.shared.as_ref().map(|s| mlp(up, s)).transpose()?,
    })
}

fn layer(up: Up, l: &Layer) -> Result<GLayer> {
    let gpu = up.gpu;
    Ok(GLayer {
        attn_norm: vec32(gpu, &l.attn_norm)?,
        mla: mla(up, &l.mla)?,
        indexer: l.indexer.as_ref().map(|i| indexer(up, i)).transpose()?,
        ffn_norm: vec32(gpu, &l.ffn_norm)?,
        ffn: match &l.ffn {
            Ffn::Dense(m) => GFfn::Dense(mlp(up, m)?),
            Ffn::Moe(m) => GFfn::Moe(moe(up, m)?),
        },
    })
}

impl GWeights {
    /// Uploads `w`; quantized projections stay compressed unless `MLASERVE_GPU_WEIGHTS=bf16`.
    pub fn upload(gpu: &Gpu, w: &Weights) -> Result<Self> {
        let up = Up {
            gpu,
            native: native_weights()?,
        };
        Ok(GWeights {
            embed: mat(gpu, &w.embed)?,
            layers: w
                .layers
                .iter()
                .map(|l| layer(up, l))
                .collect::<Result<_>>()?,
            output_norm: vec32(gpu, &w.output_norm)?,
            lm_head: up.linear(&w.lm_head)?,
        })
    }

    /// (bytes of projections kept in GGUF blocks, bytes of all projections) on the device.
    pub fn linear_bytes(&self) -> (usize, usize) {
        let mut all: Vec<&GLinear> = vec![&self.lm_head];
        for l in &self.layers {
            let m = &l.mla;
            all.extend(m.q_a.iter());
            all.extend([&m.q_b, &m.kv_a, &m.o_proj]);
            if let Some(i) = &l.indexer {
                all.extend([&i.wq_b, &i.wk, &i.proj]);
            }
            let mlps: Vec<&GMlp> = match &l.ffn {
                GFfn::Dense(d) => vec![d],
                GFfn::Moe(m) => m.experts.iter().chain(m.shared.iter()).collect(),
            };
            for p in mlps {
                all.extend([&p.gate_up, &p.down]);
            }
        }
        let q = all
            .iter()
            .filter(|l| l.qtype().is_some())
            .map(|l| l.bytes())
            .sum();
        (q, all.iter().map(|l| l.bytes()).sum())
    }
}
