//! Model weights: the GGUF/HF tensor set of DeepSeek-V2/V3 and GLM-5, loaded and checked.
//!
//! Invariants: every matrix is [out_features, in_features] in its stored ggml type (but the
//! transposed per-head `w_uk` and legacy `w_uk_t`, below); norms and router weights are f32. `kv_b` arrives either as legacy `attn_kv_b` ([N*(P+V), L], per head
//! `[K_nope rows | V rows]`) or split `attn_k_b` ([N, L, P], i.e. K transposed) + `attn_v_b`
//! ([N, V, L]); both become the same per-head matrices:
//! - `w_uk`  [N*P, L]: k_nope_h = w_uk_h · kv_c           (unabsorbed path)
//! - `w_uk_t`[N*L, P]: q_lat_h  = w_uk_t_h · q_nope_h     (absorbed path, "W_UK")
//! - `w_uv`  [N*V, L]: v_h = w_uv_h · kv_c, out_h = w_uv_h · o_lat ("W_UV", both paths)
//!
//! `w_uk` is f32 (a transpose of the stored rows); `w_uk_t` and `w_uv` keep the stored type
//! wherever they are rows of a stored tensor (legacy `w_uk_t` is a transpose: f32; legacy
//! `w_uv` a copy of its rows), so decode reads the stored blocks, not 4-byte floats, and multiply as their exact dequantized values
//! against unrounded activations (llama.cpp rounds those to Q8_0: the absorbed path would no
//! longer be the unabsorbed one's check).
//!
//! MTP/nextn layers (index >= num_layers) are never read.
//!
//! Sharded (`Shard`, see `parallel::shard` for the split): a rank holds only its heads' rows of
//! `q_b`, `w_uk`, `w_uk_t`, `w_uv` and columns of `o_proj` (`MlaWeights::num_heads` is the
//! rank's head count), its intermediate slice of the dense MLP, of the shared experts and (TP)
//! of every routed expert, or (EP) whole experts `first_expert..first_expert+experts.len()`.
//! Everything else is whole. Slices are taken before any dequantization, so a rank reads only
//! its slice of each sharded tensor.

use crate::config::{Gating, ModelConfig};
use crate::error::ModelError;
use crate::parallel::shard::{cols_slice, Shard};
use crate::source::{ExpertProj, Source};
use mlaserve_backend::QMatrix;
use std::ops::Range;

/// SwiGLU feed-forward: down(silu(gate x) * up x).
pub struct Mlp {
    /// [F, H]
    pub gate: QMatrix,
    /// [F, H]
    pub up: QMatrix,
    /// [H, F]
    pub down: QMatrix,
}

/// Routed experts plus optional shared experts.
pub struct Moe {
    /// [E, H] router, f32.
    pub router: QMatrix,
    /// [E] selection-only correction bias.
    pub correction_bias: Option<Vec<f32>>,
    /// The routed experts this rank holds: `experts[i]` is expert `first_expert + i` (all E
    /// unless expert-parallel; under tensor parallelism each is an intermediate slice).
    pub experts: Vec<Mlp>,
    /// Index of `experts[0]` among the E routed experts.
    pub first_expert: usize,
    pub shared: Option<Mlp>,
}

/// The FFN of one layer.
pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

/// MLA projections of one layer.
pub struct MlaWeights {
    /// [Lq, H] (None: plain q_proj)
    pub q_a: Option<QMatrix>,
    /// [Lq]
    pub q_a_norm: Option<Vec<f32>>,
    /// [N*(P+R), Lq or H]
    pub q_b: QMatrix,
    /// [L+R, H]
    pub kv_a: QMatrix,
    /// [L]
    pub kv_a_norm: Vec<f32>,
    /// [N*P, L]
    pub w_uk: QMatrix,
    /// [N*L, P]
    pub w_uk_t: QMatrix,
    /// [N*V, L]
    pub w_uv: QMatrix,
    /// [H, N*V]
    pub o_proj: QMatrix,
    /// Heads held here (N unsharded; N / world_size on a tensor-parallel rank): the N in the
    /// shapes above.
    pub num_heads: usize,
}

/// GLM-5 DSA lightning indexer of one layer.
pub struct IndexerWeights {
    /// [Hi*D, Lq]
    pub wq_b: QMatrix,
    /// [D, H]
    pub wk: QMatrix,
    /// [D] LayerNorm weight and bias (eps 1e-6).
    pub k_norm_w: Vec<f32>,
    pub k_norm_b: Vec<f32>,
    /// [Hi, H]
    pub proj: QMatrix,
}

/// One decoder layer.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub mla: MlaWeights,
    pub indexer: Option<IndexerWeights>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// All weights of a model.
pub struct Weights {
    /// [vocab, H]
    pub embed: QMatrix,
    pub layers: Vec<Layer>,
    /// [H]
    pub output_norm: Vec<f32>,
    /// [vocab, H]
    pub lm_head: QMatrix,
    /// The slice a tensor-parallel rank holds (None: the whole model).
    pub shard: Option<Shard>,
}

/// Reads tensors from a [`Source`], optionally dequantizing every matrix to f32. Slices are
/// cut before dequantizing.
struct Loader<'a> {
    src: &'a Source,
    dequantize: bool,
}

impl Loader<'_> {
    fn fix(&self, m: QMatrix) -> QMatrix {
        if self.dequantize && m.ty != mlaserve_gguf::GgmlType::F32 {
            QMatrix::from_f32(m.rows, m.cols, m.to_f32())
        } else {
            m
        }
    }
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix, ModelError> {
        Ok(self.fix(self.src.matrix(name, rows, cols)?))
    }
    /// Rows `part` of a [rows, cols] matrix.
    fn matrix_rows(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        part: Range<usize>,
    ) -> Result<QMatrix, ModelError> {
        let m = self.src.matrix(name, rows, cols)?;
        Ok(self.fix(m.rows_slice(part.start, part.len())))
    }
    /// Columns `part` of a [rows, cols] matrix.
    fn matrix_cols(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        part: Range<usize>,
    ) -> Result<QMatrix, ModelError> {
        let m = self.src.matrix(name, rows, cols)?;
        Ok(self.fix(cols_slice(&m, part, name)))
    }
    /// Expert `e` of layer `layer`, restricted to intermediate slice `part` (gate/up rows,
    /// down columns).
    fn expert(
        &self,
        layer: usize,
        e: usize,
        num_experts: usize,
        h: usize,
        f: usize,
        part: Range<usize>,
    ) -> Result<Mlp, ModelError> {
        let gate = self
            .src
            .expert(layer, ExpertProj::Gate, e, num_experts, f, h)?;
        let up = self
            .src
            .expert(layer, ExpertProj::Up, e, num_experts, f, h)?;
        let down = self
            .src
            .expert(layer, ExpertProj::Down, e, num_experts, h, f)?;
        let name = format!("blk.{layer}.ffn_down_exps.weight[{e}]");
        Ok(Mlp {
            gate: self.fix(gate.rows_slice(part.start, part.len())),
            up: self.fix(up.rows_slice(part.start, part.len())),
            down: self.fix(cols_slice(&down, part, &name)),
        })
    }
    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.src.f32(name, shape)
    }
    fn has(&self, name: &str) -> bool {
        self.src.has(name)
    }
    fn name(&self) -> String {
        self.src.name()
    }
}

/// SwiGLU of `{prefix}.ffn_{gate,up,down}{suffix}` with intermediate size `f`, restricted to
/// intermediate slice `part`.
fn mlp(
    src: &Loader,
    prefix: &str,
    suffix: &str,
    h: usize,
    f: usize,
    part: Range<usize>,
) -> Result<Mlp, ModelError> {
    Ok(Mlp {
        gate: src.matrix_rows(
            &format!("{prefix}.ffn_gate{suffix}.weight"),
            f,
            h,
            part.clone(),
        )?,
        up: src.matrix_rows(
            &format!("{prefix}.ffn_up{suffix}.weight"),
            f,
            h,
            part.clone(),
        )?,
        down: src.matrix_cols(&format!("{prefix}.ffn_down{suffix}.weight"), h, f, part)?,
    })
}

/// Per-head absorbed matrices of heads `heads` from either kv_b layout (only their rows are
/// read). `w_uk_t` and `w_uv` are rows of the stored tensors where the layout has them as rows
/// (split `attn_k_b`/`attn_v_b`: both; legacy `attn_kv_b`: `w_uv`), kept in the file's type
/// and multiplied as their exact values against f32 activations
/// ([`QMatrix::with_f32_activations`]), so the absorbed path computes what the unabsorbed
/// one does; the transposes (`w_uk`, legacy `w_uk_t`) are f32.
fn kv_b(
    src: &Loader,
    cfg: &ModelConfig,
    i: usize,
    heads: Range<usize>,
) -> Result<(QMatrix, QMatrix, QMatrix), ModelError> {
    let (n_all, p, v, l) = (
        cfg.num_heads,
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
        cfg.kv_lora_rank,
    );
    let (h0, n) = (heads.start, heads.len());
    let legacy = format!("blk.{i}.attn_kv_b.weight");
    // Per head, a [rows, cols] block of `m` ([n * rows, cols]) transposed to [cols, rows].
    let per_head_t = |m: &[f32], rows: usize, cols: usize| {
        let mut t = vec![0f32; n * rows * cols];
        for h in 0..n {
            for r in 0..rows {
                for c in 0..cols {
                    t[(h * cols + c) * rows + r] = m[(h * rows + r) * cols + c];
                }
            }
        }
        t
    };
    if src.has(&legacy) {
        // [N*(P+V), L], per head [K_nope (P rows) | V (V rows)].
        let kvb = src.src.rows(
            &legacy,
            &[n_all * (p + v), l],
            h0 * (p + v)..(h0 + n) * (p + v),
        )?;
        let rb = kvb.row_bytes();
        let mut uv = Vec::with_capacity(n * v * rb);
        let mut w_uk = Vec::with_capacity(n * p * l);
        for h in 0..n {
            let base = h * (p + v);
            w_uk.extend(kvb.rows_slice(base, p).to_f32());
            uv.extend_from_slice(&kvb.data()[(base + p) * rb..(base + p + v) * rb]);
        }
        let w_uk_t = per_head_t(&w_uk, p, l);
        let w_uv = QMatrix::new(kvb.ty, n * v, l, uv.into())
            .map_err(|e| src.src.tensor_err(&legacy, e.to_string()))?;
        Ok((
            QMatrix::from_f32(n * p, l, w_uk),
            QMatrix::from_f32(n * l, p, w_uk_t),
            src.fix(w_uv).with_f32_activations(),
        ))
    } else {
        // attn_k_b [N, L, P]: k_b[h, l, p] = W_UK_h[p, l], i.e. w_uk_t's rows. attn_v_b
        // [N, V, L] = W_UV_h.
        let w_uk_t = src.src.rows(
            &format!("blk.{i}.attn_k_b.weight"),
            &[n_all, l, p],
            h0 * l..(h0 + n) * l,
        )?;
        let w_uv = src.src.rows(
            &format!("blk.{i}.attn_v_b.weight"),
            &[n_all, v, l],
            h0 * v..(h0 + n) * v,
        )?;
        Ok((
            QMatrix::from_f32(n * p, l, per_head_t(&w_uk_t.to_f32(), l, p)),
            src.fix(w_uk_t).with_f32_activations(),
            src.fix(w_uv).with_f32_activations(),
        ))
    }
}

impl Weights {
    /// Whether any matrix is stored in a type other than F32 (activations then get rounded).
    pub fn has_quantized(&self) -> bool {
        use mlaserve_gguf::GgmlType::F32;
        let mla = |m: &MlaWeights| m.q_b.ty != F32 || m.kv_a.ty != F32 || m.o_proj.ty != F32;
        self.embed.ty != F32 || self.lm_head.ty != F32 || self.layers.iter().any(|l| mla(&l.mla))
    }

    /// Load and shape-check every tensor the config calls for. With `dequantize`, every matrix
    /// is converted to f32 (activations then stay f32 too: the exact-arithmetic reading of a
    /// quantized file, used to separate quantization error from logic errors).
    pub fn load(src: &Source, cfg: &ModelConfig, dequantize: bool) -> Result<Self, ModelError> {
        Self::load_shard(src, cfg, dequantize, None)
    }

    /// [`Weights::load`] of one tensor-parallel rank's slice (`None`: the whole model). A head
    /// count, intermediate size or (EP) expert count that does not divide by the world size is
    /// an error naming it.
    pub fn load_shard(
        src: &Source,
        cfg: &ModelConfig,
        dequantize: bool,
        shard: Option<Shard>,
    ) -> Result<Self, ModelError> {
        let src = &Loader { src, dequantize };
        let source_name = src.name();
        let part = |total: usize, what: &str| -> Result<Range<usize>, ModelError> {
            match &shard {
                Some(s) => s.range(total, what, &source_name),
                None => Ok(0..total),
            }
        };
        let h = cfg.hidden_size;
        let (n, r, v) = (cfg.num_heads, cfg.qk_rope_head_dim, cfg.v_head_dim);
        let qk = cfg.qk_head_dim();
        let l = cfg.kv_lora_rank;
        let heads = part(n, "num_heads (attention heads)")?;
        let nl = heads.len();
        let embed = src.matrix("token_embd.weight", cfg.vocab_size, h)?;
        let lm_head = if src.has("output.weight") {
            src.matrix("output.weight", cfg.vocab_size, h)?
        } else {
            embed.clone()
        };
        let output_norm = src.f32("output_norm.weight", &[h])?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let b = format!("blk.{i}");
            let q_rows = heads.start * qk..heads.end * qk;
            let (q_a, q_a_norm, q_b) = match cfg.q_lora_rank {
                Some(lq) => (
                    Some(src.matrix(&format!("{b}.attn_q_a.weight"), lq, h)?),
                    Some(src.f32(&format!("{b}.attn_q_a_norm.weight"), &[lq])?),
                    src.matrix_rows(&format!("{b}.attn_q_b.weight"), n * qk, lq, q_rows)?,
                ),
                None => (
                    None,
                    None,
                    src.matrix_rows(&format!("{b}.attn_q.weight"), n * qk, h, q_rows)?,
                ),
            };
            let (w_uk, w_uk_t, w_uv) = kv_b(src, cfg, i, heads.clone())?;
            let mla = MlaWeights {
                q_a,
                q_a_norm,
                q_b,
                kv_a: src.matrix(&format!("{b}.attn_kv_a_mqa.weight"), l + r, h)?,
                kv_a_norm: src.f32(&format!("{b}.attn_kv_a_norm.weight"), &[l])?,
                w_uk,
                w_uk_t,
                w_uv,
                o_proj: src.matrix_cols(
                    &format!("{b}.attn_output.weight"),
                    h,
                    n * v,
                    heads.start * v..heads.end * v,
                )?,
                num_heads: nl,
            };
            let indexer = match (&cfg.indexer, cfg.q_lora_rank) {
                (Some(ix), Some(lq)) => Some(IndexerWeights {
                    wq_b: src.matrix(
                        &format!("{b}.indexer.attn_q_b.weight"),
                        ix.num_heads * ix.head_dim,
                        lq,
                    )?,
                    wk: src.matrix(&format!("{b}.indexer.attn_k.weight"), ix.head_dim, h)?,
                    k_norm_w: src.f32(&format!("{b}.indexer.k_norm.weight"), &[ix.head_dim])?,
                    k_norm_b: src.f32(&format!("{b}.indexer.k_norm.bias"), &[ix.head_dim])?,
                    proj: src.matrix(&format!("{b}.indexer.proj.weight"), ix.num_heads, h)?,
                }),
                _ => None,
            };
            let ffn = match &cfg.moe {
                Some(m) if cfg.is_moe_layer(i) => {
                    let e = m.num_experts;
                    let f = m.moe_intermediate_size;
                    let router = QMatrix::from_f32(
                        e,
                        h,
                        src.f32(&format!("{b}.ffn_gate_inp.weight"), &[e, h])?,
                    );
                    let bias_name = format!("{b}.exp_probs_b.bias");
                    let correction_bias = if src.has(&bias_name) {
                        Some(src.f32(&bias_name, &[e])?)
                    } else {
                        None
                    };
                    if m.gating == Gating::Sigmoid
                        && correction_bias.is_none()
                        && m.has_correction_bias
                    {
                        return Err(ModelError::Tensor {
                            source_name: src.name(),
                            tensor: bias_name,
                            msg: "sigmoid (noaux_tc) routing needs the correction bias".into(),
                        });
                    }
                    let ep = shard.is_some_and(|s| s.expert_parallel);
                    let (mine, slice) = if ep {
                        (
                            part(e, "num_experts (routed experts, expert-parallel)")?,
                            0..f,
                        )
                    } else {
                        (0..e, part(f, "moe_intermediate_size (routed experts)")?)
                    };
                    let first_expert = mine.start;
                    let experts = mine
                        .map(|x| src.expert(i, x, e, h, f, slice.clone()))
                        .collect::<Result<Vec<_>, _>>()?;
                    let shared = if m.num_shared_experts > 0 {
                        let fs = f * m.num_shared_experts;
                        let sp = part(fs, "shared experts' intermediate size")?;
                        Some(mlp(src, &b, "_shexp", h, fs, sp)?)
                    } else {
                        None
                    };
                    Ffn::Moe(Moe {
                        router,
                        correction_bias,
                        experts,
                        first_expert,
                        shared,
                    })
                }
                _ => {
                    let fd = cfg.intermediate_size;
                    let dp = part(fd, "intermediate_size (dense MLP)")?;
                    Ffn::Dense(mlp(src, &b, "", h, fd, dp)?)
                }
            };
            layers.push(Layer {
                attn_norm: src.f32(&format!("{b}.attn_norm.weight"), &[h])?,
                mla,
                indexer,
                ffn_norm: src.f32(&format!("{b}.ffn_norm.weight"), &[h])?,
                ffn,
            });
        }
        Ok(Weights {
            embed,
            layers,
            output_norm,
            lm_head,
            shard,
        })
    }
}
