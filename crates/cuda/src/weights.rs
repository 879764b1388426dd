//! Weights on the GPU: every matrix in bf16 (GGUF blocks dequantized on the host first),
//! norms, biases and the MoE router in f32. Same names and shapes as
//! `mlaserve_model::weights`; gate and up of each SwiGLU MLP are stacked into one
//! `gate_up` [2F, H] matrix so one GEMM computes both.

use crate::error::Result;
use crate::gpu::{DBuf, Gpu};
use mlaserve_backend::QMatrix;
use mlaserve_model::weights::{Ffn, IndexerWeights, Layer, MlaWeights, Mlp, Moe, Weights};
use rayon::prelude::*;

/// A bf16 matrix [rows, cols].
pub struct GMat {
    pub w: DBuf<u16>,
    pub rows: usize,
    pub cols: usize,
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

fn vec32(gpu: &Gpu, v: &[f32]) -> Result<DBuf<f32>> {
    gpu.upload(v)
}

/// SwiGLU MLP: gate_up [2F, H], down [H, F].
pub struct GMlp {
    pub gate_up: GMat,
    pub down: GMat,
    pub f: usize,
}

fn mlp(gpu: &Gpu, m: &Mlp) -> Result<GMlp> {
    let bf16 = mlaserve_gguf::GgmlType::BF16;
    let w = if m.gate.ty == bf16 && m.up.ty == bf16 {
        let (g, u) = (
            m.gate.rows * m.gate.row_bytes(),
            m.up.rows * m.up.row_bytes(),
        );
        let mut bytes = Vec::with_capacity(g + u);
        bytes.extend_from_slice(&m.gate.data()[..g]);
        bytes.extend_from_slice(&m.up.data()[..u]);
        gpu.upload_bytes(&bytes)?
    } else {
        let mut gu = m.gate.to_f32();
        gu.extend(m.up.to_f32());
        gpu.upload(&bf16_bits(&gu))?
    };
    Ok(GMlp {
        gate_up: GMat {
            w,
            rows: 2 * m.gate.rows,
            cols: m.gate.cols,
        },
        down: mat(gpu, &m.down)?,
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
    pub q_a: Option<GMat>,
    pub q_a_norm: Option<DBuf<f32>>,
    pub q_b: GMat,
    pub kv_a: GMat,
    pub kv_a_norm: DBuf<f32>,
    /// [N*P, L]
    pub w_uk: GMat,
    /// [N*L, P]
    pub w_uk_t: GMat,
    /// [N*V, L]
    pub w_uv: GMat,
    pub o_proj: GMat,
}

pub struct GIndexer {
    pub wq_b: GMat,
    pub wk: GMat,
    pub k_norm_w: DBuf<f32>,
    pub k_norm_b: DBuf<f32>,
    pub proj: GMat,
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
    pub lm_head: GMat,
}

fn mla(gpu: &Gpu, w: &MlaWeights) -> Result<GMla> {
    Ok(GMla {
        num_heads: w.num_heads,
        q_a: w.q_a.as_ref().map(|m| mat(gpu, m)).transpose()?,
        q_a_norm: w.q_a_norm.as_ref().map(|v| vec32(gpu, v)).transpose()?,
        q_b: mat(gpu, &w.q_b)?,
        kv_a: mat(gpu, &w.kv_a)?,
        kv_a_norm: vec32(gpu, &w.kv_a_norm)?,
        w_uk: mat(gpu, &w.w_uk)?,
        w_uk_t: mat(gpu, &w.w_uk_t)?,
        w_uv: mat(gpu, &w.w_uv)?,
        o_proj: mat(gpu, &w.o_proj)?,
    })
}

fn indexer(gpu: &Gpu, w: &IndexerWeights) -> Result<GIndexer> {
    Ok(GIndexer {
        wq_b: mat(gpu, &w.wq_b)?,
        wk: mat(gpu, &w.wk)?,
        k_norm_w: vec32(gpu, &w.k_norm_w)?,
        k_norm_b: vec32(gpu, &w.k_norm_b)?,
        proj: mat(gpu, &w.proj)?,
    })
}

fn moe(gpu: &Gpu, m: &Moe) -> Result<GMoe> {
    let experts: Vec<GMlp> = m
        .experts
        .iter()
        .map(|e| mlp(gpu, e))
        .collect::<Result<_>>()?;
    let gu: Vec<u64> = experts.iter().map(|e| e.gate_up.w.ptr()).collect();
    let dn: Vec<u64> = experts.iter().map(|e| e.down.w.ptr()).collect();
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
        experts,
        shared: m.shared.as_ref().map(|s| mlp(gpu, s)).transpose()?,
    })
}

fn layer(gpu: &Gpu, l: &Layer) -> Result<GLayer> {
    Ok(GLayer {
        attn_norm: vec32(gpu, &l.attn_norm)?,
        mla: mla(gpu, &l.mla)?,
        indexer: l.indexer.as_ref().map(|i| indexer(gpu, i)).transpose()?,
        ffn_norm: vec32(gpu, &l.ffn_norm)?,
        ffn: match &l.ffn {
            Ffn::Dense(m) => GFfn::Dense(mlp(gpu, m)?),
            Ffn::Moe(m) => GFfn::Moe(moe(gpu, m)?),
        },
    })
}

impl GWeights {
    pub fn upload(gpu: &Gpu, w: &Weights) -> Result<Self> {
        Ok(GWeights {
            embed: mat(gpu, &w.embed)?,
            layers: w
                .layers
                .iter()
                .map(|l| layer(gpu, l))
                .collect::<Result<_>>()?,
            output_norm: vec32(gpu, &w.output_norm)?,
            lm_head: mat(gpu, &w.lm_head)?,
        })
    }
}
