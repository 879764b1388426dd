//! `ModelConfig`: every dimension and switch of an MLA model, built once and validated.
//!
//! Two sources: GGUF metadata (`deepseek2`, `glm-dsa`, as llama.cpp's converter writes it) and an
//! HF `config.json` (`deepseek_v2`, `deepseek_v3`, `glm_moe_dsa`). Nothing downstream reads
//! metadata keys. Invariants after [`ModelConfig::validate`]:
//! - `qk_rope_head_dim` is even and > 0; `qk_nope_head_dim`, `v_head_dim`, `kv_lora_rank` > 0;
//! - MoE: `top_k <= num_experts`, `num_experts % n_group == 0`, `topk_group <= n_group`;
//! - `num_layers` counts only the main layers (MTP/nextn layers are excluded).
//!
//! Meaning of absent keys follows llama.cpp's files: no `q_lora_rank` means a plain `q_proj`;
//! no `expert_gating_func` means softmax for `deepseek2` and sigmoid for `glm-dsa` — except a
//! `deepseek2` file that carries `exp_probs_b` (correction bias) tensors, whose only consistent
//! reading is sigmoid (a warning is recorded).

use crate::error::ModelError;
use mlaserve_gguf::GgufFile;
use serde_json::Value as Json;

/// The model family, which decides the tensor set and a few defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// DeepSeek-V2/V2-Lite/V3 and relatives (GGUF `deepseek2`).
    Deepseek2,
    /// GLM-5 with the DSA lightning indexer (GGUF `glm-dsa`, HF `glm_moe_dsa`).
    GlmDsa,
}

impl Arch {
    /// The GGUF architecture string.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Deepseek2 => "deepseek2",
            Arch::GlmDsa => "glm-dsa",
        }
    }
}

/// How router logits become expert probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// DeepSeek-V2: softmax, greedy or group-limited (group score = max).
    Softmax,
    /// DeepSeek-V3 / GLM-5 `noaux_tc`: sigmoid, bias for selection only (group score = top-2 sum).
    Sigmoid,
}

/// DeepSeek YaRN rope scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Context extension factor s (> 1).
    pub factor: f32,
    /// Context the model was pre-trained with.
    pub original_context_length: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `0.1 * mscale_all_dim` (GGUF `rope.scaling.yarn_log_multiplier`).
    pub log_multiplier: f32,
    /// Magnitude applied to cos/sin: `get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)`
    /// (1.0 whenever mscale == mscale_all_dim, as in every released DeepSeek model).
    pub attn_factor: f32,
}

impl Yarn {
    /// `mscale = 1 + log_multiplier * ln(factor)` — the square multiplies the softmax scale.
    pub fn mscale(&self) -> f32 {
        if self.factor <= 1.0 {
            1.0
        } else {
            1.0 + self.log_multiplier * self.factor.ln()
        }
    }
}

/// Mixture-of-experts settings (layers >= `first_k_dense`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub num_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub gating: Gating,
    /// The router has an `e_score_correction_bias` (selection only).
    pub has_correction_bias: bool,
}

/// GLM-5 DSA lightning indexer.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexerConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    /// Keys each query attends to when the context is longer.
    pub topk: usize,
}

/// Every dimension and switch the forward pass needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Main decoder layers (MTP/nextn layers excluded).
    pub num_layers: usize,
    /// MTP/nextn layers present in the file and skipped.
    pub num_nextn_layers: usize,
    pub context_length: usize,
    /// N: query heads.
    pub num_heads: usize,
    /// Lq; `None` means a plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// L: width of the compressed latent.
    pub kv_lora_rank: usize,
    /// P
    pub qk_nope_head_dim: usize,
    /// R
    pub qk_rope_head_dim: usize,
    /// V
    pub v_head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub yarn: Option<Yarn>,
    /// Dense MLP width (layers < `first_k_dense`).
    pub intermediate_size: usize,
    pub first_k_dense: usize,
    pub moe: Option<MoeConfig>,
    pub indexer: Option<IndexerConfig>,
    /// Things a user should know about how the file was read.
    pub warnings: Vec<String>,
}

impl ModelConfig {
    /// P + R: the per-head query/key width of the unabsorbed path.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// L + R: one latent cache row.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// The one softmax scale of all three attention paths: `(P+R)^-0.5 * mscale^2`.
    /// Never `(L+R)^-0.5`, even though the absorbed path's dot products are 576 wide.
    pub fn softmax_scale(&self) -> f32 {
        let base = (self.qk_head_dim() as f32).powf(-0.5);
        match &self.yarn {
            Some(y) => base * y.mscale() * y.mscale(),
            None => base,
        }
    }

    /// Whether layer `i` has a routed-expert FFN.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe.is_some() && i >= self.first_k_dense
    }

    /// Read the config from GGUF metadata. `has_tensor` answers whether a tensor exists (for
    /// the readings that depend on which tensors a file has).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let src = file.path().display().to_string();
        let err = |msg: String| ModelError::Config {
            source_name: src.clone(),
            msg,
        };
        let arch_name = file
            .architecture()
            .ok_or_else(|| err("no general.architecture key".into()))?
            .to_string();
        let arch = match arch_name.as_str() {
            "deepseek2" => Arch::Deepseek2,
            "glm-dsa" => Arch::GlmDsa,
            other => {
                return Err(err(format!(
                    "architecture `{other}` is not an MLA model this engine runs (expected deepseek2 or glm-dsa)"
                )))
            }
        };
        let a = arch_name.as_str();
        let key = |k: &str| format!("{a}.{k}");
        let get_u = |k: &str| -> Result<Option<usize>, ModelError> {
            Ok(file.get_u64(&key(k))?.map(|v| v as usize))
        };
        let req_u = |k: &str| -> Result<usize, ModelError> {
            get_u(k)?.ok_or_else(|| err(format!("missing required key `{}`", key(k))))
        };
        let get_f = |k: &str| -> Result<Option<f32>, ModelError> { Ok(file.get_f32(&key(k))?) };
        let mut warnings = Vec::new();

        let block_count = req_u("block_count")?;
        let num_nextn_layers = get_u("nextn_predict_layers")?.unwrap_or(0);
        if num_nextn_layers > 0 {
            warnings.push(format!(
                "{a}.block_count = {block_count} includes {num_nextn_layers} MTP/nextn layer(s); they are skipped"
            ));
        }
        let num_layers = block_count
            .checked_sub(num_nextn_layers)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                err(format!(
                    "block_count {block_count} <= nextn_predict_layers {num_nextn_layers}"
                ))
            })?;
        let hidden_size = req_u("embedding_length")?;
        let num_heads = req_u("attention.head_count")?;
        let kv_lora_rank = req_u("attention.kv_lora_rank")?;
        let qk_rope_head_dim = req_u("rope.dimension_count")?;
        let q_lora_rank = get_u("attention.q_lora_rank")?.filter(|&r| r > 0);

        // Head dims: `*_mla` keys are the real ones; key_length/value_length are the MQA view
        // (576/512) in MLA-era files, and the real dims in legacy (attn_kv_b) files.
        let key_len = get_u("attention.key_length")?;
        let val_len = get_u("attention.value_length")?;
        let key_mla = get_u("attention.key_length_mla")?;
        let val_mla = get_u("attention.value_length_mla")?;
        let has_kv_b = file.tensor("blk.0.attn_kv_b.weight").is_some();
        let (qk_head_dim, v_head_dim) = match (key_mla, val_mla) {
            (Some(k), Some(v)) if k > 0 && v > 0 => {
                if key_len == Some(kv_lora_rank + qk_rope_head_dim) && val_len == Some(kv_lora_rank)
                {
                    warnings.push(format!(
                        "head_count_kv/key_length/value_length ({}/{}) are the MQA view of MLA; real head dims from key_length_mla/value_length_mla: {k}/{v}",
                        kv_lora_rank + qk_rope_head_dim,
                        kv_lora_rank
                    ));
                }
                (k, v)
            }
            _ => {
                if !has_kv_b {
                    return Err(err(
                        "no key_length_mla/value_length_mla and no attn_kv_b tensor: a file from before llama.cpp's MLA support (PR #12801) whose split attn_k_b/attn_v_b cannot be interpreted; reconvert it".into(),
                    ));
                }
                let k = key_len
                    .ok_or_else(|| err("legacy file without attention.key_length".into()))?;
                let v = val_len
                    .ok_or_else(|| err("legacy file without attention.value_length".into()))?;
                warnings.push(
                    "legacy layout: attn_kv_b with per-head key/value lengths (no *_mla keys)"
                        .into(),
                );
                (k, v)
            }
        };
        let qk_nope_head_dim = qk_head_dim
            .checked_sub(qk_rope_head_dim)
            .filter(|&p| p > 0)
            .ok_or_else(|| {
                err(format!(
                    "key length {qk_head_dim} <= rope dimension {qk_rope_head_dim}"
                ))
            })?;

        let rms_norm_eps = get_f("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6);
        let rope_theta = get_f("rope.freq_base")?.unwrap_or(10000.0);
        let context_length = get_u("context_length")?.unwrap_or(4096);
        let scaling_type = file.get_str(&key("rope.scaling.type"))?.map(str::to_string);
        let yarn = match scaling_type.as_deref() {
            None | Some("none") => None,
            Some("yarn") => {
                let factor = get_f("rope.scaling.factor")?.unwrap_or(1.0);
                let log_mul = get_f("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0);
                let orig = get_u("rope.scaling.original_context_length")?.unwrap_or(context_length);
                if factor > 1.0 && log_mul == 0.0 {
                    warnings.push("YaRN without rope.scaling.yarn_log_multiplier: softmax scale gets no mscale^2".into());
                }
                if log_mul > 0.5 {
                    warnings.push(format!(
                        "rope.scaling.yarn_log_multiplier = {log_mul} looks like mscale_all_dim itself rather than 0.1*mscale_all_dim"
                    ));
                }
                Some(Yarn {
                    factor,
                    original_context_length: orig,
                    beta_fast: get_f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                    beta_slow: get_f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                    log_multiplier: log_mul,
                    attn_factor: 1.0,
                })
            }
            Some(other) => {
                return Err(err(format!("rope scaling type `{other}` is not supported")))
            }
        };

        let vocab_size = match get_u("vocab_size")? {
            Some(v) => v,
            None => file
                .tensor("token_embd.weight")
                .and_then(|t| t.shape().first().copied())
                .ok_or_else(|| err("no vocab_size key and no token_embd.weight tensor".into()))?,
        };
        let intermediate_size = get_u("feed_forward_length")?.unwrap_or(0);
        let num_experts = get_u("expert_count")?.unwrap_or(0);
        let first_k_dense = get_u("leading_dense_block_count")?.unwrap_or(0);
        let moe = if num_experts > 0 {
            let has_bias = (0..num_layers)
                .any(|i| file.tensor(&format!("blk.{i}.exp_probs_b.bias")).is_some());
            let gating = match get_u("expert_gating_func")? {
                Some(1) => Gating::Softmax,
                Some(2) => Gating::Sigmoid,
                Some(other) => {
                    return Err(err(format!(
                        "expert_gating_func {other} is not supported (1 softmax, 2 sigmoid)"
                    )))
                }
                None => match arch {
                    Arch::GlmDsa => Gating::Sigmoid,
                    Arch::Deepseek2 if has_bias => {
                        warnings.push("deepseek2 file has exp_probs_b (correction bias) tensors but no expert_gating_func: reading it as sigmoid (noaux_tc), the only consistent gating; llama.cpp would silently use softmax".into());
                        Gating::Sigmoid
                    }
                    Arch::Deepseek2 => Gating::Softmax,
                },
            };
            if gating == Gating::Softmax && has_bias {
                warnings.push("softmax gating with a correction bias present: the bias is used for selection only".into());
            }
            Some(MoeConfig {
                num_experts,
                top_k: req_u("expert_used_count")?,
                num_shared_experts: get_u("expert_shared_count")?.unwrap_or(0),
                moe_intermediate_size: req_u("expert_feed_forward_length")?,
                n_group: get_u("expert_group_count")?.unwrap_or(1).max(1),
                topk_group: get_u("expert_group_used_count")?.unwrap_or(1).max(1),
                routed_scaling_factor: get_f("expert_weights_scale")?.unwrap_or(1.0),
                norm_topk_prob: file.get_bool(&key("expert_weights_norm"))?.unwrap_or(false),
                gating,
                has_correction_bias: has_bias,
            })
        } else {
            None
        };
        let indexer = match arch {
            Arch::GlmDsa => Some(IndexerConfig {
                num_heads: req_u("attention.indexer.head_count")?,
                head_dim: req_u("attention.indexer.key_length")?,
                topk: req_u("attention.indexer.top_k")?,
            }),
            Arch::Deepseek2 => None,
        };
        let cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            num_layers,
            num_nextn_layers,
            context_length,
            num_heads,
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            rms_norm_eps,
            rope_theta,
            yarn,
            intermediate_size,
            first_k_dense,
            moe,
            indexer,
            warnings,
        };
        cfg.validate(&src)?;
        Ok(cfg)
    }

    /// Read an HF `config.json` (`deepseek_v2`, `deepseek_v3`, `glm_moe_dsa`).
    pub fn from_hf_json(text: &str, source_name: &str) -> Result<Self, ModelError> {
        let err = |msg: String| ModelError::Config {
            source_name: source_name.to_string(),
            msg,
        };
        let j: Json =
            serde_json::from_str(text).map_err(|e| err(format!("config.json is not JSON: {e}")))?;
        let u = |k: &str| j.get(k).and_then(Json::as_u64).map(|v| v as usize);
        let req = |k: &str| u(k).ok_or_else(|| err(format!("missing or non-integer `{k}`")));
        let f = |k: &str| j.get(k).and_then(Json::as_f64).map(|v| v as f32);
        let model_type = j.get("model_type").and_then(Json::as_str).unwrap_or("");
        let arch = match model_type {
            "deepseek_v2" | "deepseek_v3" => Arch::Deepseek2,
            "glm_moe_dsa" => Arch::GlmDsa,
            other => {
                return Err(err(format!(
                    "model_type `{other}` is not supported (deepseek_v2, deepseek_v3, glm_moe_dsa)"
                )))
            }
        };
        let mut warnings = Vec::new();
        // transformers 5 keeps rope settings in `rope_parameters`; older configs in rope_scaling/rope_theta.
        let rope = j
            .get("rope_parameters")
            .or_else(|| j.get("rope_scaling"))
            .filter(|v| v.is_object());
        let rf = |k: &str| {
            rope.and_then(|r| r.get(k))
                .and_then(Json::as_f64)
                .map(|v| v as f32)
        };
        let rope_type = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Json::as_str)
            .unwrap_or("default");
        let rope_theta = f("rope_theta")
            .or_else(|| rf("rope_theta"))
            .unwrap_or(10000.0);
        let context_length = u("max_position_embeddings").unwrap_or(4096);
        let yarn = match rope_type {
            "default" => None,
            "yarn" | "deepseek_yarn" => {
                let factor = rf("factor").unwrap_or(1.0);
                let m = rf("mscale").unwrap_or(0.0);
                let m_all = rf("mscale_all_dim").unwrap_or(0.0);
                let get_mscale = |s: f32, m: f32| {
                    if s <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * s.ln() + 1.0
                    }
                };
                // As transformers: the ratio when both are given, else get_mscale(factor) on cos/sin.
                let attn_factor = if m != 0.0 && m_all != 0.0 {
                    get_mscale(factor, m) / get_mscale(factor, m_all)
                } else {
                    get_mscale(factor, 1.0)
                };
                Some(Yarn {
                    factor,
                    original_context_length: rope
                        .and_then(|r| r.get("original_max_position_embeddings"))
                        .and_then(Json::as_u64)
                        .map(|v| v as usize)
                        .unwrap_or(context_length),
                    beta_fast: rf("beta_fast").unwrap_or(32.0),
                    beta_slow: rf("beta_slow").unwrap_or(1.0),
                    log_multiplier: 0.1 * m_all,
                    attn_factor,
                })
            }
            other => return Err(err(format!("rope type `{other}` is not supported"))),
        };
        let n_routed = u("n_routed_experts").unwrap_or(0);
        let scoring = j.get("scoring_func").and_then(Json::as_str);
        let topk_method = j.get("topk_method").and_then(Json::as_str);
        let moe = if n_routed > 0 {
            let gating = match (arch, model_type, scoring) {
                (_, _, Some("softmax")) => Gating::Softmax,
                (_, _, Some("sigmoid")) => Gating::Sigmoid,
                (_, _, Some(other)) => {
                    return Err(err(format!("scoring_func `{other}` is not supported")))
                }
                (Arch::GlmDsa, _, None) | (_, "deepseek_v3", None) => Gating::Sigmoid,
                _ => Gating::Softmax,
            };
            if model_type == "deepseek_v2" && topk_method == Some("noaux_tc") {
                warnings.push("deepseek_v2 config with topk_method noaux_tc".into());
            }
            Some(MoeConfig {
                num_experts: n_routed,
                top_k: req("num_experts_per_tok")?,
                num_shared_experts: u("n_shared_experts").unwrap_or(0),
                moe_intermediate_size: req("moe_intermediate_size")?,
                n_group: u("n_group").unwrap_or(1).max(1),
                topk_group: u("topk_group").unwrap_or(1).max(1),
                routed_scaling_factor: f("routed_scaling_factor").unwrap_or(1.0),
                norm_topk_prob: j
                    .get("norm_topk_prob")
                    .and_then(Json::as_bool)
                    .unwrap_or(false),
                gating,
                has_correction_bias: gating == Gating::Sigmoid,
            })
        } else {
            None
        };
        let indexer = match arch {
            Arch::GlmDsa => Some(IndexerConfig {
                num_heads: req("index_n_heads")?,
                head_dim: req("index_head_dim")?,
                topk: req("index_topk")?,
            }),
            Arch::Deepseek2 => None,
        };
        let cfg = ModelConfig {
            arch,
            vocab_size: req("vocab_size")?,
            hidden_size: req("hidden_size")?,
            num_layers: req("num_hidden_layers")?,
            num_nextn_layers: u("num_nextn_predict_layers").unwrap_or(0),
            context_length,
            num_heads: req("num_attention_heads")?,
            q_lora_rank: u("q_lora_rank").filter(|&r| r > 0),
            kv_lora_rank: req("kv_lora_rank")?,
            qk_nope_head_dim: req("qk_nope_head_dim")?,
            qk_rope_head_dim: req("qk_rope_head_dim")?,
            v_head_dim: req("v_head_dim")?,
            rms_norm_eps: f("rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            yarn,
            intermediate_size: u("intermediate_size").unwrap_or(0),
            first_k_dense: u("first_k_dense_replace").unwrap_or(0),
            moe,
            indexer,
            warnings,
        };
        cfg.validate(source_name)?;
        Ok(cfg)
    }

    /// Check every derived dimension; called by both constructors.
    pub fn validate(&self, source_name: &str) -> Result<(), ModelError> {
        let err = |msg: String| {
            Err(ModelError::Config {
                source_name: source_name.to_string(),
                msg,
            })
        };
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ];
        for (name, v) in positive {
            if v == 0 {
                return err(format!("{name} must be > 0"));
            }
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return err(format!(
                "qk_rope_head_dim {} must be even (rotated in pairs)",
                self.qk_rope_head_dim
            ));
        }
        if self.first_k_dense > 0 && self.intermediate_size == 0 {
            return err("dense layers present but feed_forward_length is 0".into());
        }
        if let Some(m) = &self.moe {
            if m.top_k == 0 || m.top_k > m.num_experts {
                return err(format!(
                    "expert_used_count {} must be in 1..={}",
                    m.top_k, m.num_experts
                ));
            }
            if m.num_experts % m.n_group != 0 {
                return err(format!(
                    "expert_count {} not divisible by expert_group_count {}",
                    m.num_experts, m.n_group
                ));
            }
            if m.topk_group > m.n_group {
                return err(format!(
                    "expert_group_used_count {} > expert_group_count {}",
                    m.topk_group, m.n_group
                ));
            }
            if m.n_group > 1 && m.topk_group * (m.num_experts / m.n_group) < m.top_k {
                return err(
                    "the kept expert groups hold fewer experts than expert_used_count".into(),
                );
            }
            if m.gating == Gating::Sigmoid && m.n_group > 1 && m.num_experts / m.n_group < 2 {
                return err("sigmoid group routing scores a group by its top-2 experts: groups need >= 2 experts".into());
            }
            if m.moe_intermediate_size == 0 {
                return err("expert_feed_forward_length must be > 0".into());
            }
        } else if self.first_k_dense < self.num_layers && self.intermediate_size == 0 {
            return err("no experts and no dense feed_forward_length".into());
        }
        if let Some(ix) = &self.indexer {
            if ix.num_heads == 0 || ix.topk == 0 {
                return err("indexer head_count and top_k must be > 0".into());
            }
            if ix.head_dim < self.qk_rope_head_dim {
                return err(format!(
                    "indexer key_length {} < rope dimension {}",
                    ix.head_dim, self.qk_rope_head_dim
                ));
            }
            if self.q_lora_rank.is_none() {
                return err(
                    "the DSA indexer reads the q_lora latent, but the model has no q_lora_rank"
                        .into(),
                );
            }
        }
        if let Some(y) = &self.yarn {
            if !(y.factor.is_finite() && y.factor > 0.0) {
                return err(format!("YaRN factor {} is not a positive number", y.factor));
            }
        }
        Ok(())
    }

    /// A human-readable summary (used by `inspect` and `doctor`).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let mut line = |k: &str, v: String| s.push_str(&format!("  {k:<28} {v}\n"));
        line("arch", self.arch.gguf_name().into());
        line(
            "layers",
            format!(
                "{} (+{} MTP skipped)",
                self.num_layers, self.num_nextn_layers
            ),
        );
        line(
            "hidden / vocab",
            format!("{} / {}", self.hidden_size, self.vocab_size),
        );
        line("heads N", self.num_heads.to_string());
        line(
            "q_lora_rank",
            self.q_lora_rank
                .map_or("none (plain q_proj)".into(), |r| r.to_string()),
        );
        line("kv_lora_rank L", self.kv_lora_rank.to_string());
        line(
            "P / R / V",
            format!(
                "{} / {} / {}",
                self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
            ),
        );
        line(
            "latent cache row",
            format!("{} values / token / layer", self.latent_dim()),
        );
        line("rope theta", self.rope_theta.to_string());
        if let Some(y) = &self.yarn {
            line(
                "yarn",
                format!(
                    "factor {} orig {} log_mul {} -> mscale {:.6}",
                    y.factor,
                    y.original_context_length,
                    y.log_multiplier,
                    y.mscale()
                ),
            );
        }
        line("softmax scale", format!("{:.6}", self.softmax_scale()));
        line("rms eps", self.rms_norm_eps.to_string());
        line(
            "dense layers",
            format!("{} (ffn {})", self.first_k_dense, self.intermediate_size),
        );
        if let Some(m) = &self.moe {
            line(
                "experts",
                format!(
                    "{} routed top-{} + {} shared, ffn {}, groups {}/{}, {:?}, scale {}, norm {}",
                    m.num_experts,
                    m.top_k,
                    m.num_shared_experts,
                    m.moe_intermediate_size,
                    m.topk_group,
                    m.n_group,
                    m.gating,
                    m.routed_scaling_factor,
                    m.norm_topk_prob
                ),
            );
        }
        if let Some(ix) = &self.indexer {
            line(
                "DSA indexer",
                format!("{} heads x {}, top-{}", ix.num_heads, ix.head_dim, ix.topk),
            );
        }
        s
    }
}
