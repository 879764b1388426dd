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
        QType::from_ggml(m.ty).filter(|t| self.native && m.cols.is_multiple_of(t.block_values()))
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
    /// The first routed expert held (0 unless expert-parallel).
    pub first_expert: usize,
    /// Selection-only bias, applied on the host where routing runs.
    pub correction_bias: Option<Vec<f32>>,
    /// `experts[i]` is routed expert `first_expert + i` (all of them unless expert-parallel).
    pub experts: Vec<GMlp>,
    /// The shared experts as one MLP (intermediate `shared.f`), if the model has them.
    pub shared: Option<GMlp>,
    /// Shared-expert slices in the pointer tables after the routed experts (0: none): views
    /// of `shared` as wide as one routed expert, which the one-token expert kernels run as
    /// `slices` more experts of weight 1 ([`shared_slices`], `ops::SliceViews`): bf16, in
    /// both tables (the fused kernels); Q8_0 or Q4_K, in `gate_up_ptrs` only (the int8
    /// gate|up GEMV over pairs takes whole rows; a column slice of the shared down is not
    /// blocks, so the shared down reads the slices' intermediate as one vector).
    pub slices: usize,
    /// [experts.len() + slices] device pointers of each held expert's gate_up, then of the
    /// slice views (GEMV paths); `down_ptrs` likewise, its slice views bf16 only.
    pub gate_up_ptrs: DBuf<u64>,
    pub down_ptrs: DBuf<u64>,
    /// The block type of every routed expert's gate_up / down (None: bf16).
    pub gate_up_ty: Option<QType>,
    pub down_ty: Option<QType>,
    /// The selection-only bias on the device (GPU routing), if any.
    pub bias_dev: Option<DBuf<f32>>,
}

// One a layer, built once at load and never moved on a hot path: no Box for the larger variant.
#[allow(clippy::large_enum_variant)]
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

/// Whether shared experts run as slices in the one-token expert kernels
/// (`MLASERVE_FUSE_SHARED`, default on).
fn fuse_shared() -> bool {
    std::env::var("MLASERVE_FUSE_SHARED").map_or(true, |v| v != "0")
}

/// Whether a quantized shared expert's gate|up runs as slices in the routed experts' gate|up
/// GEMV over pairs for one token ([`shared_slices`]): one launch fewer a MoE layer, the same
/// bits; the V2-Lite b1 step on an H100 1,485 -> 1,406 µs (Q4_K), 1,679 -> 1,646 (Q8_0)
/// (bench/cuda/v2lite.md, session 46). `MLASERVE_QMV_SLICES=0`: never, for comparisons.
pub(crate) fn qmv_slices() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_SLICES").map_or(true, |v| v != "0"))
}

/// How many slices as wide as one routed expert the shared experts of `m` make (slice j: rows
/// j*F..(j+1)*F of gate and up, the same columns of down; SwiGLU is elementwise in the
/// intermediate and down sums over it, so the slices add up to the shared MLP), each run as
/// one more expert taken by every token with weight 1. 0 where that does not hold exactly or
/// the kernels cannot read the slices in place: expert-parallel shards (ids of other ranks'
/// experts would alias the slices), a width that is not a multiple, other shapes than the
/// routed experts', or weights kept in GGUF blocks — except gate and up, routed and shared,
/// all kept in one block type (`blocks`: a slice is whole rows, for the int8 gate|up GEMV over
/// pairs; the downs stay whole, any type).
#[allow(clippy::manual_is_multiple_of)] // MSRV 1.85
fn shared_slices(m: &Moe, keeps: &dyn Fn(&QMatrix) -> Option<QType>, blocks: bool) -> usize {
    let (Some(sh), Some(e0)) = (m.shared.as_ref(), m.experts.first()) else {
        return 0;
    };
    let f = e0.gate.rows;
    let fs = sh.gate.rows;
    let readable = if blocks {
        let ty = keeps(&e0.gate);
        ty.is_some() && [&e0.up, &sh.gate, &sh.up].iter().all(|q| keeps(q) == ty)
    } else {
        [&e0.gate, &e0.up, &e0.down, &sh.gate, &sh.up, &sh.down]
            .iter()
            .all(|q| keeps(q).is_none())
    };
    if m.first_expert != 0
        || m.experts.len() != m.router.rows
        || f == 0
        || fs % f != 0
        || sh.up.rows != fs
        || sh.down.cols != fs
        || sh.gate.cols != e0.gate.cols
        || sh.down.rows != e0.down.rows
        || !readable
    {
        return 0;
    }
    fs / f
}

fn moe(up: Up, m: &Moe) -> Result<GMoe> {
    let gpu = up.gpu;
    let experts: Vec<GMlp> = m
        .experts
        .iter()
        .map(|e| mlp(up, e))
        .collect::<Result<_>>()?;
    let shared = m.shared.as_ref().map(|s| mlp(up, s)).transpose()?;
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
    let mut gu: Vec<u64> = experts.iter().map(|e| e.gate_up.ptr()).collect();
    let mut dn: Vec<u64> = experts.iter().map(|e| e.down.ptr()).collect();
    let mut slices = 0;
    if let (true, Some(sh), Some(e0)) = (fuse_shared(), &shared, experts.first()) {
        match (&sh.gate_up, &sh.down) {
            (GLinear::Bf16(g), GLinear::Bf16(d)) => {
                slices = shared_slices(m, &|q| up.keeps(q), false);
                let (f, h) = (e0.f, g.cols);
                for j in 0..slices {
                    gu.push(g.w.at(j * f * h));
                    dn.push(d.w.at(j * f));
                }
            }
            (GLinear::Quant(g), _) if qmv_slices() => {
                slices = shared_slices(m, &|q| up.keeps(q), true);
                gu.extend((0..slices).map(|j| g.row_ptr(j * e0.f)));
            }
            _ => {}
        }
    }
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
        shared,
        slices,
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

#[cfg(test)]
mod tests {
    use super::*;
    use mlaserve_gguf::GgmlType;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    fn mat(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> QMatrix {
        let v = rand(rows * cols, seed);
        match ty {
            GgmlType::F32 => QMatrix::from_f32(rows, cols, v),
            _ => QMatrix::quantize_from_f32(ty, rows, cols, &v).unwrap(),
        }
    }

    fn mlp(ty: GgmlType, f: usize, h: usize, seed: u64) -> Mlp {
        Mlp {
            gate: mat(ty, f, h, seed),
            up: mat(ty, f, h, seed + 1),
            down: mat(ty, h, f, seed + 2),
        }
    }

    fn moe(ty: GgmlType, sh_ty: GgmlType, f: usize, fs: usize, h: usize) -> Moe {
        Moe {
            router: mat(GgmlType::F32, 4, h, 1),
            correction_bias: None,
            experts: (0..4).map(|e| mlp(ty, f, h, 10 + 3 * e as u64)).collect(),
            first_expert: 0,
            shared: Some(mlp(sh_ty, fs, h, 99)),
        }
    }

    fn keeps_q8(m: &QMatrix) -> Option<QType> {
        QType::from_ggml(m.ty).filter(|t| m.cols.is_multiple_of(t.block_values()))
    }

    /// The shared MLP is cut into slices only where they are exact and readable in place:
    /// bf16 storage (f32 uploads as bf16), a width that is a multiple of the experts', not in
    /// GGUF blocks, not an expert-parallel shard — or, for the int8 gate|up GEMV, gate and up
    /// all in one block type (whole rows), the downs any type. (The slices summing to the
    /// shared MLP is checked on the GPU: tests/ops/moe.rs, moe_gemv_swiglu/combine and
    /// qmv_pairs_glu with slice views.)
    #[test]
    fn shared_slices_only_where_exact() {
        let bf16 = |m: &Moe| shared_slices(m, &keeps_q8, false);
        let quant = |m: &Moe| shared_slices(m, &keeps_q8, true);
        for (ty, f, fs, h) in [(GgmlType::F32, 8, 24, 16), (GgmlType::BF16, 64, 128, 64)] {
            assert_eq!(bf16(&moe(ty, ty, f, fs, h)), fs / f);
            assert_eq!(quant(&moe(ty, ty, f, fs, h)), 0);
        }
        // A shared width that is not a multiple of the expert width.
        assert_eq!(bf16(&moe(GgmlType::F32, GgmlType::F32, 8, 20, 16)), 0);
        // Routed or shared experts kept in blocks.
        let m = moe(GgmlType::Q8_0, GgmlType::F32, 64, 128, 64);
        assert_eq!(bf16(&m), 0);
        let m = moe(GgmlType::F32, GgmlType::Q8_0, 64, 128, 64);
        assert_eq!(bf16(&m), 0);
        // Gate and up, routed and shared, in one block type: slices for the int8 GEMV,
        // whatever the downs.
        let (q4, q8) = (GgmlType::Q4_K, GgmlType::Q8_0);
        for ty in [q4, q8] {
            let mut m = moe(ty, ty, 256, 768, 256);
            assert_eq!(quant(&m), 3);
            assert_eq!(bf16(&m), 0);
            m.shared.as_mut().unwrap().down = mat(GgmlType::F32, 256, 768, 7);
            assert_eq!(quant(&m), 3);
            // ... not a shared width that is not a multiple
            let sh = m.shared.as_mut().unwrap();
            (sh.gate, sh.up) = (mat(ty, 384, 256, 3), mat(ty, 384, 256, 4));
            sh.down = mat(GgmlType::F32, 256, 384, 5);
            assert_eq!(quant(&m), 0);
        }
        // ... nor types mixed.
        assert_eq!(quant(&moe(q4, q8, 256, 768, 256)), 0);
        // Expert-parallel shard: other ranks' ids would alias the slices.
        let mut m = moe(GgmlType::F32, GgmlType::F32, 8, 16, 16);
        m.first_expert = 4;
        assert_eq!(bf16(&m), 0);
        let mut m = moe(q4, q4, 256, 512, 256);
        m.first_expert = 4;
        assert_eq!(quant(&m), 0);
    }
}
