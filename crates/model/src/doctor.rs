//! `doctor`: find what is wrong with a model file in one command.
//!
//! Four checks, each producing findings with a severity; any `Error` makes the verdict unhealthy:
//! (a) metadata: dimensions, the MQA-view fields, YaRN and the mscale it implies, expert counts,
//!     a gating function that contradicts the tensors, tokenizer ids in range;
//! (b) paths: a short prompt through the unabsorbed (mha), absorbed (mqa) and chunked (context)
//!     paths on the real weights; the first probe where they part is reported with its numbers;
//! (c) norms, layer by layer: an attention output far smaller than its value vectors (collapse)
//!     or larger than all of them (a convex combination cannot be), NaN/Inf, exploding residuals;
//! (d) with a reference dump (`tools/hf_dump.py`), the first probe whose relative error passes
//!     the threshold.
//! Probes are compared in execution order, so "first" means first in the forward pass.

use crate::config::{Gating, ModelConfig};
use crate::forward_batch::AttentionPath;
use crate::model::{LoadOptions, Model};
use crate::probe::{self, Record};
use crate::score::score;
use mlaserve_backend::matmul;
use mlaserve_gguf::GgufFile;
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One observation.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub severity: Severity,
    /// The probe (e.g. `L0.mla.attn_out`) or metadata key concerned.
    pub location: String,
    pub message: String,
}

/// Everything doctor found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub healthy: bool,
    pub verdict: String,
    pub findings: Vec<Finding>,
}

fn f(
    check: &'static str,
    severity: Severity,
    location: impl Into<String>,
    message: impl Into<String>,
) -> Finding {
    Finding {
        check,
        severity,
        location: location.into(),
        message: message.into(),
    }
}

/// Relative L2 error ||a-b|| / ||b||.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// (a) metadata checks on a GGUF file.
pub fn check_metadata(file: &GgufFile, cfg: &ModelConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    let a = cfg.arch.gguf_name();
    for w in &cfg.warnings {
        out.push(f("metadata", Severity::Info, a, w.clone()));
    }
    if let Some(y) = &cfg.yarn {
        let m = y.mscale();
        let loc = format!("{a}.rope.scaling.yarn_log_multiplier");
        if y.log_multiplier > 0.5 {
            out.push(f(
                "metadata",
                Severity::Error,
                loc,
                format!(
                    "yarn_log_multiplier = {} is 0.1*mscale_all_dim in GGUF (0.1 for DeepSeek-V3, 0.0707 for V2); this value looks like mscale_all_dim itself (the 0.1 applied twice or not at all): mscale = {m:.4}, softmax scale x{:.3} too sharp (L*.mla.attn_out)",
                    y.log_multiplier,
                    (m / (1.0 + 0.1 * y.log_multiplier * y.factor.ln())).powi(2)
                ),
            ));
        } else {
            out.push(f(
                "metadata",
                Severity::Info,
                loc,
                format!(
                    "YaRN factor {} -> mscale {m:.6}, softmax scale {:.6}",
                    y.factor,
                    cfg.softmax_scale()
                ),
            ));
        }
    }
    if let Some(moe) = &cfg.moe {
        if moe.gating == Gating::Sigmoid
            && moe.norm_topk_prob
            && file.get(&format!("{a}.expert_weights_scale")).is_none()
        {
            out.push(f(
                "metadata",
                Severity::Error,
                format!("{a}.expert_weights_scale"),
                format!(
                    "sigmoid (noaux_tc) routing with normalized top-k weights but no expert_weights_scale: routed experts sum to 1 instead of routed_scaling_factor (2.5 in DeepSeek-V3 and GLM-5); every MoE layer's output is wrong from L{}.moe.out on",
                    cfg.first_k_dense
                ),
            ));
        }
        if moe.gating == Gating::Softmax && moe.has_correction_bias {
            out.push(f("metadata", Severity::Warning, format!("{a}.expert_gating_func"), "softmax gating declared, but the file has exp_probs_b correction-bias tensors (a noaux_tc model?)"));
        }
    }
    let vocab = cfg.vocab_size as u64;
    for key in [
        "bos_token_id",
        "eos_token_id",
        "eot_token_id",
        "eom_token_id",
        "padding_token_id",
    ] {
        let k = format!("tokenizer.ggml.{key}");
        if let Ok(Some(id)) = file.get_u64(&k) {
            if id >= vocab {
                out.push(f(
                    "metadata",
                    Severity::Error,
                    k,
                    format!("token id {id} >= vocab size {vocab}"),
                ));
            }
        }
    }
    if let Ok(Some(tokens)) = file.get_str_array("tokenizer.ggml.tokens") {
        if tokens.len() as u64 != vocab {
            out.push(f(
                "metadata",
                Severity::Warning,
                "tokenizer.ggml.tokens",
                format!("{} tokens, embedding has {vocab} rows", tokens.len()),
            ));
        }
    }
    out
}

/// Probes as (name, values, shape), in capture order.
pub type Captured = Vec<(String, Vec<f32>, Vec<usize>)>;

/// Concatenate the records of each probe name over steps: name -> (data, row shape), in order.
fn by_name(records: Vec<Record>) -> Captured {
    let mut order: Vec<String> = Vec::new();
    let mut map: HashMap<String, (Vec<f32>, Vec<usize>)> = HashMap::new();
    for r in records {
        let e = map.entry(r.name.clone()).or_insert_with(|| {
            order.push(r.name.clone());
            (Vec::new(), r.shape[1..].to_vec())
        });
        e.0.extend_from_slice(&r.data);
    }
    order
        .into_iter()
        .map(|n| {
            let (d, s) = map.remove(&n).unwrap_or_default();
            (n, d, s)
        })
        .collect()
}

/// Run `tokens` on one path and capture every probe.
pub fn capture(
    model: &Model,
    tokens: &[u32],
    path: AttentionPath,
    chunk: usize,
) -> Result<Captured, crate::ModelError> {
    probe::start_capture("*");
    let r = score(model, tokens, path, chunk);
    let recs = probe::take_capture();
    r?;
    Ok(by_name(recs))
}

/// (b) the three paths against each other: the first probe that parts.
pub fn check_paths(
    model: &Model,
    tokens: &[u32],
    threshold: f64,
) -> Result<Vec<Finding>, crate::ModelError> {
    let base = capture(model, tokens, AttentionPath::Mha, 0)?;
    let mut out = Vec::new();
    for (label, path, chunk) in [
        ("mqa (absorbed)", AttentionPath::Mqa, 0),
        ("chunked by 3 (context merge)", AttentionPath::Auto, 3),
    ] {
        let other = capture(model, tokens, path, chunk)?;
        let other: HashMap<_, _> = other.into_iter().map(|(n, d, _)| (n, d)).collect();
        let mut parted = false;
        for (name, want, _) in &base {
            let Some(got) = other.get(name) else { continue };
            let e = rel_l2(got, want);
            if e > threshold || got.len() != want.len() {
                out.push(f("paths", Severity::Error, name.clone(), format!(
                    "{label} parts from mha at {name}: relative L2 error {e:.3e} (threshold {threshold:.0e}); ||mha|| = {:.4e}, ||{label}|| = {:.4e}",
                    want.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt(),
                    got.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
                )));
                parted = true;
                break;
            }
        }
        if !parted {
            let e = base
                .last()
                .and_then(|(n, d, _)| other.get(n).map(|g| rel_l2(g, d)))
                .unwrap_or(0.0);
            out.push(f(
                "paths",
                Severity::Info,
                "logits",
                format!("{label} agrees with mha at every probe (logits rel err {e:.2e})"),
            ));
        }
    }
    Ok(out)
}

/// (c) norm sanity, layer by layer, on one run's probes.
pub fn check_norms(model: &Model, probes: &[(String, Vec<f32>, Vec<usize>)]) -> Vec<Finding> {
    let cfg = model.config();
    let mut out = Vec::new();
    let get = |n: &str| {
        probes
            .iter()
            .find(|(name, ..)| name == n)
            .map(|(_, d, _)| d.as_slice())
    };
    let (n, v, l) = (cfg.num_heads, cfg.v_head_dim, cfg.kv_lora_rank);
    let mut prev_norm: Option<f64> = None;
    for li in 0..cfg.num_layers {
        for (name, data, _) in probes
            .iter()
            .filter(|(name, ..)| name.starts_with(&format!("L{li}.")))
        {
            let s = probe::Stats::of(data);
            if s.nan > 0 || s.inf > 0 {
                out.push(f(
                    "norms",
                    Severity::Error,
                    name.clone(),
                    format!("{} NaN and {} Inf values", s.nan, s.inf),
                ));
            }
        }
        if let (Some(kvc), Some(att)) = (
            get(&format!("L{li}.mla.kv_c_normed")),
            get(&format!("L{li}.mla.attn_out")),
        ) {
            let t = kvc.len() / l;
            let mut vals = vec![0f32; t * n * v];
            matmul(kvc, t, &model.weights().layers[li].mla.w_uv, &mut vals);
            let row_norm = |x: &[f32]| x.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
            let v_mean = vals.chunks(v).map(row_norm).sum::<f64>() / (t * n) as f64;
            let v_max = vals.chunks(v).map(row_norm).fold(0f64, f64::max);
            let a_mean = att.chunks(v).map(row_norm).sum::<f64>() / (t * n) as f64;
            let a_max = att.chunks(v).map(row_norm).fold(0f64, f64::max);
            let ratio = a_mean / v_mean.max(1e-30);
            let loc = format!("L{li}.mla.attn_out");
            if ratio < 1e-2 {
                out.push(f("norms", Severity::Error, loc, format!("attention output collapsed: mean head norm {a_mean:.4e} is {:.0}x smaller than its value vectors' {v_mean:.4e}", 1.0 / ratio)));
            } else if a_max > v_max * 1.01 + 1e-6 {
                out.push(f("norms", Severity::Error, loc, format!("attention output norm {a_max:.4e} exceeds every value vector ({v_max:.4e}): softmax weights do not sum to 1")));
            } else {
                out.push(f(
                    "norms",
                    Severity::Info,
                    loc,
                    format!("|attn_out|/|v| = {ratio:.3}"),
                ));
            }
        }
        if let Some(x) = get(&format!("L{li}.out")) {
            let norm = probe::Stats::of(x).l2;
            if let Some(p) = prev_norm {
                if norm > 100.0 * p || norm < p / 100.0 {
                    out.push(f(
                        "norms",
                        Severity::Error,
                        format!("L{li}.out"),
                        format!("residual stream norm jumped from {p:.4e} to {norm:.4e}"),
                    ));
                }
            }
            prev_norm = Some(norm);
        }
    }
    out
}

/// A reference dump: probe name -> data, plus the token ids it was computed on.
pub struct ReferenceDump {
    pub tokens: Vec<u32>,
    pub tensors: HashMap<String, Vec<f32>>,
}

impl ReferenceDump {
    /// Read a safetensors dump written by `tools/hf_dump.py` (or by `--dump`).
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut tensors = HashMap::new();
        let mut tokens = None;
        for (name, view) in st.tensors() {
            let d = view.data();
            match view.dtype() {
                safetensors::Dtype::F32 => {
                    tensors.insert(
                        name,
                        d.chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    );
                }
                safetensors::Dtype::I64 if name == "tokens" => {
                    tokens = Some(
                        d.chunks_exact(8)
                            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as u32)
                            .collect(),
                    );
                }
                _ => {}
            }
        }
        let tokens = tokens.ok_or_else(|| {
            format!(
                "{}: no `tokens` (i64) tensor: cannot rerun the same prompt",
                path.display()
            )
        })?;
        Ok(ReferenceDump { tokens, tensors })
    }
}

/// (d) the first probe whose relative error against the reference passes `threshold`.
pub fn check_reference(
    model: &Model,
    reference: &ReferenceDump,
    threshold: f64,
) -> Result<Vec<Finding>, crate::ModelError> {
    let ours = capture(model, &reference.tokens, AttentionPath::Auto, 0)?;
    let mut compared = 0;
    for (name, data, _) in &ours {
        let Some(want) = reference.tensors.get(name) else {
            continue;
        };
        if want.len() != data.len() {
            return Ok(vec![f(
                "reference",
                Severity::Error,
                name.clone(),
                format!(
                    "shape differs: {} values here, {} in the reference",
                    data.len(),
                    want.len()
                ),
            )]);
        }
        compared += 1;
        let e = rel_l2(data, want);
        if e > threshold {
            return Ok(vec![f("reference", Severity::Error, name.clone(), format!(
                "first divergence from the reference at {name}: relative L2 error {e:.3e} (threshold {threshold:.0e}) after {compared} matching probes"
            ))]);
        }
    }
    if compared == 0 {
        return Ok(vec![f(
            "reference",
            Severity::Warning,
            "-",
            "no probe name in common with the reference dump",
        )]);
    }
    Ok(vec![f(
        "reference",
        Severity::Info,
        "-",
        format!("all {compared} common probes within {threshold:.0e} of the reference"),
    )])
}

/// Run every check on `path`.
pub fn diagnose(path: &Path, reference: Option<&Path>) -> Report {
    let mut findings = Vec::new();
    let name = path.display().to_string();
    let finish = |findings: Vec<Finding>| {
        let first_err = findings.iter().find(|x| x.severity == Severity::Error);
        let verdict = match first_err {
            Some(e) => format!("UNHEALTHY: [{}] {}: {}", e.check, e.location, e.message),
            None => {
                "healthy: metadata consistent, all attention paths agree, norms sane".to_string()
            }
        };
        Report {
            model: name.clone(),
            healthy: first_err.is_none(),
            verdict,
            findings,
        }
    };
    if path.is_file() {
        match GgufFile::open(path) {
            Ok(file) => match ModelConfig::from_gguf(&file) {
                Ok(cfg) => findings.extend(check_metadata(&file, &cfg)),
                Err(e) => {
                    findings.push(f("metadata", Severity::Error, "config", e.to_string()));
                    return finish(findings);
                }
            },
            Err(e) => {
                findings.push(f("metadata", Severity::Error, "file", e.to_string()));
                return finish(findings);
            }
        }
    }
    let model = match Model::load(path, &LoadOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            findings.push(f("load", Severity::Error, "weights", e.to_string()));
            return finish(findings);
        }
    };
    let quantized = model.weights().has_quantized();
    let threshold = if quantized { 3e-2 } else { 1e-3 };
    let vocab = model.config().vocab_size as u64;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let tokens: Vec<u32> = (0..12)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab) as u32
        })
        .collect();
    match check_paths(&model, &tokens, threshold) {
        Ok(v) => findings.extend(v),
        Err(e) => findings.push(f("paths", Severity::Error, "forward", e.to_string())),
    }
    match capture(&model, &tokens, AttentionPath::Auto, 0) {
        Ok(p) => findings.extend(check_norms(&model, &p)),
        Err(e) => findings.push(f("norms", Severity::Error, "forward", e.to_string())),
    }
    if let Some(r) = reference {
        match ReferenceDump::load(r) {
            Ok(dump) => match check_reference(&model, &dump, if quantized { 5e-2 } else { 1e-3 }) {
                Ok(v) => findings.extend(v),
                Err(e) => findings.push(f("reference", Severity::Error, "forward", e.to_string())),
            },
            Err(e) => findings.push(f("reference", Severity::Error, r.display().to_string(), e)),
        }
    }
    finish(findings)
}
