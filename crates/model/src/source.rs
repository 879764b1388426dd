//! Where tensors come from: a GGUF file or an HF safetensors directory, behind one name table.
//!
//! Tensors are requested by their GGUF name (`blk.3.attn_q_b.weight`); the HF source maps that
//! name to the checkpoint's (`model.layers.3.self_attn.q_b_proj.weight`). Shapes are in torch
//! order. Matrices stay in their stored type and, where the layout allows, point into the
//! memory map (zero copy).

use crate::error::ModelError;
use memmap2::Mmap;
use mlaserve_backend::{Bytes, QMatrix};
use mlaserve_gguf::{GgmlType, GgufFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tensor of an HF checkpoint, located in a mapped safetensors file.
struct StEntry {
    file: usize,
    dtype: GgmlType,
    shape: Vec<usize>,
    range: std::ops::Range<usize>,
}

/// An HF checkpoint directory: config.json + one or more *.safetensors files.
pub struct HfDir {
    pub dir: PathBuf,
    pub config_json: String,
    maps: Vec<Arc<Mmap>>,
    entries: HashMap<String, StEntry>,
}

struct MmapBytes(Arc<Mmap>);
impl AsRef<[u8]> for MmapBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl HfDir {
    /// Map every `*.safetensors` file of `dir` and index its tensors.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let io = |msg: String| ModelError::Io {
            path: dir.to_path_buf(),
            msg,
        };
        let config_json = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| io(format!("config.json: {e}")))?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(io("no *.safetensors files".into()));
        }
        let mut maps = Vec::new();
        let mut entries = HashMap::new();
        for (fi, path) in files.iter().enumerate() {
            let f = std::fs::File::open(path).map_err(|e| ModelError::Io {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            // SAFETY: the file is mapped read-only; concurrent truncation by another process is
            // outside what any mmap-based loader can defend against.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| ModelError::Io {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            let (header_len, meta) =
                safetensors::SafeTensors::read_metadata(&map).map_err(|e| ModelError::Io {
                    path: path.clone(),
                    msg: format!("bad safetensors header: {e}"),
                })?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    safetensors::Dtype::F32 => GgmlType::F32,
                    safetensors::Dtype::F16 => GgmlType::F16,
                    safetensors::Dtype::BF16 => GgmlType::BF16,
                    other => {
                        return Err(ModelError::Tensor {
                            source_name: path.display().to_string(),
                            tensor: name.clone(),
                            msg: format!("dtype {other:?} is not supported (F32, F16, BF16)"),
                        })
                    }
                };
                let (a, b) = info.data_offsets;
                entries.insert(
                    name.clone(),
                    StEntry {
                        file: fi,
                        dtype,
                        shape: info.shape.clone(),
                        range: base + a..base + b,
                    },
                );
            }
            maps.push(Arc::new(map));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config_json,
            maps,
            entries,
        })
    }
}

/// GGUF tensor name -> HF checkpoint name (None when HF has no single counterpart).
pub fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output.weight" => Some("lm_head.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, name) = rest.split_once('.')?;
    let hf = match name {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q_a.weight" => "self_attn.q_a_proj.weight",
        "attn_q_a_norm.weight" => "self_attn.q_a_layernorm.weight",
        "attn_q_b.weight" => "self_attn.q_b_proj.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_kv_a_mqa.weight" => "self_attn.kv_a_proj_with_mqa.weight",
        "attn_kv_a_norm.weight" => "self_attn.kv_a_layernorm.weight",
        "attn_kv_b.weight" => "self_attn.kv_b_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        "ffn_gate_inp.weight" => "mlp.gate.weight",
        "exp_probs_b.bias" => "mlp.gate.e_score_correction_bias",
        "ffn_gate_shexp.weight" => "mlp.shared_experts.gate_proj.weight",
        "ffn_up_shexp.weight" => "mlp.shared_experts.up_proj.weight",
        "ffn_down_shexp.weight" => "mlp.shared_experts.down_proj.weight",
        "indexer.attn_q_b.weight" => "self_attn.indexer.wq_b.weight",
        "indexer.attn_k.weight" => "self_attn.indexer.wk.weight",
        "indexer.k_norm.weight" => "self_attn.indexer.k_norm.weight",
        "indexer.k_norm.bias" => "self_attn.indexer.k_norm.bias",
        "indexer.proj.weight" => "self_attn.indexer.weights_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Which projection of an expert.
#[derive(Debug, Clone, Copy)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
}

/// A tensor store addressed by GGUF names.
pub enum Source {
    Gguf(Arc<GgufFile>),
    Hf(HfDir),
}

impl Source {
    /// A short name for error messages.
    pub fn name(&self) -> String {
        match self {
            Source::Gguf(f) => f.path().display().to_string(),
            Source::Hf(d) => d.dir.display().to_string(),
        }
    }

    pub(crate) fn tensor_err(&self, tensor: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Tensor {
            source_name: self.name(),
            tensor: tensor.to_string(),
            msg: msg.into(),
        }
    }

    /// Whether the tensor exists.
    pub fn has(&self, name: &str) -> bool {
        match self {
            Source::Gguf(f) => f.tensor(name).is_some(),
            Source::Hf(d) => hf_name(name).is_some_and(|n| d.entries.contains_key(&n)),
        }
    }

    /// (type, torch shape, bytes) of a tensor.
    fn raw(&self, name: &str) -> Result<(GgmlType, Vec<usize>, Bytes), ModelError> {
        match self {
            Source::Gguf(f) => {
                let info = f
                    .tensor(name)
                    .ok_or_else(|| self.tensor_err(name, "missing"))?;
                let tb = f.tensor_bytes(info);
                let len = tb.len();
                Ok((
                    info.ggml_type,
                    info.shape(),
                    Bytes::from_arc(Arc::new(tb), 0..len),
                ))
            }
            Source::Hf(d) => {
                let hf = hf_name(name).ok_or_else(|| self.tensor_err(name, "no HF counterpart"))?;
                let e = d
                    .entries
                    .get(&hf)
                    .ok_or_else(|| self.tensor_err(name, format!("missing (HF name `{hf}`)")))?;
                let map: Arc<dyn AsRef<[u8]> + Send + Sync> =
                    Arc::new(MmapBytes(d.maps[e.file].clone()));
                Ok((
                    e.dtype,
                    e.shape.clone(),
                    Bytes::from_arc(map, e.range.clone()),
                ))
            }
        }
    }

    /// A matrix of torch shape [rows, cols] (any shape whose last dim is `cols` and whose
    /// element count is rows*cols, e.g. a stacked [E, F, H] tensor as [E*F, H]).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix, ModelError> {
        let (ty, shape, bytes) = self.raw(name)?;
        let n: usize = shape.iter().product();
        if shape.last() != Some(&cols) || n != rows * cols {
            return Err(
                self.tensor_err(name, format!("shape {shape:?}, expected [{rows}, {cols}]"))
            );
        }
        QMatrix::new(ty, rows, cols, bytes).map_err(|e| self.tensor_err(name, e.to_string()))
    }

    /// A tensor of exactly `shape`, dequantized to f32.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let (ty, got, bytes) = self.raw(name)?;
        if got != shape {
            return Err(self.tensor_err(name, format!("shape {got:?}, expected {shape:?}")));
        }
        let cols = *shape.last().unwrap_or(&1);
        let rows = shape.iter().product::<usize>() / cols.max(1);
        let m = QMatrix::new(ty, rows, cols, bytes)
            .map_err(|e| self.tensor_err(name, e.to_string()))?;
        Ok(m.to_f32())
    }

    /// Rows `rows` of a tensor of exactly `shape`, viewed as `[prod(shape[..-1]), shape[-1]]`,
    /// dequantized to f32 (only those rows are read).
    pub fn f32_rows(
        &self,
        name: &str,
        shape: &[usize],
        rows: std::ops::Range<usize>,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self.rows(name, shape, rows)?.to_f32())
    }

    /// Rows `rows` of a tensor of exactly `shape`, viewed as `[prod(shape[..-1]), shape[-1]]`,
    /// in the stored type.
    pub fn rows(
        &self,
        name: &str,
        shape: &[usize],
        rows: std::ops::Range<usize>,
    ) -> Result<QMatrix, ModelError> {
        let (ty, got, bytes) = self.raw(name)?;
        if got != shape {
            return Err(self.tensor_err(name, format!("shape {got:?}, expected {shape:?}")));
        }
        let cols = *shape.last().unwrap_or(&1);
        let total = shape.iter().product::<usize>() / cols.max(1);
        if rows.end > total || rows.start > rows.end {
            return Err(self.tensor_err(name, format!("rows {rows:?} of {total}")));
        }
        let m = QMatrix::new(ty, total, cols, bytes)
            .map_err(|e| self.tensor_err(name, e.to_string()))?;
        Ok(m.rows_slice(rows.start, rows.len()))
    }

    /// Expert `e`'s projection of layer `layer`: [rows, cols] (gate/up [F, H], down [H, F]).
    pub fn expert(
        &self,
        layer: usize,
        proj: ExpertProj,
        e: usize,
        num_experts: usize,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix, ModelError> {
        let short = match proj {
            ExpertProj::Gate => "gate",
            ExpertProj::Up => "up",
            ExpertProj::Down => "down",
        };
        match self {
            Source::Gguf(_) => {
                let name = format!("blk.{layer}.ffn_{short}_exps.weight");
                Ok(self
                    .matrix(&name, num_experts * rows, cols)?
                    .rows_slice(e * rows, rows))
            }
            Source::Hf(d) => {
                let per = format!("model.layers.{layer}.mlp.experts.{e}.{short}_proj.weight");
                if let Some(en) = d.entries.get(&per) {
                    if en.shape != [rows, cols] {
                        return Err(self.tensor_err(
                            &per,
                            format!("shape {:?}, expected [{rows}, {cols}]", en.shape),
                        ));
                    }
                    let map: Arc<dyn AsRef<[u8]> + Send + Sync> =
                        Arc::new(MmapBytes(d.maps[en.file].clone()));
                    return QMatrix::new(
                        en.dtype,
                        rows,
                        cols,
                        Bytes::from_arc(map, en.range.clone()),
                    )
                    .map_err(|er| self.tensor_err(&per, er.to_string()));
                }
                // transformers 5 fused layout: gate_up_proj [E, 2F, H] (gate rows first), down_proj [E, H, F].
                let (fused, row0, total_rows) = match proj {
                    ExpertProj::Gate => ("gate_up_proj", 0, 2 * rows),
                    ExpertProj::Up => ("gate_up_proj", rows, 2 * rows),
                    ExpertProj::Down => ("down_proj", 0, rows),
                };
                let name = format!("model.layers.{layer}.mlp.experts.{fused}");
                let en = d.entries.get(&name).ok_or_else(|| {
                    self.tensor_err(&per, "missing (neither per-expert nor fused experts found)")
                })?;
                if en.shape != [num_experts, total_rows, cols] {
                    return Err(self.tensor_err(
                        &name,
                        format!(
                            "shape {:?}, expected [{num_experts}, {total_rows}, {cols}]",
                            en.shape
                        ),
                    ));
                }
                let map: Arc<dyn AsRef<[u8]> + Send + Sync> =
                    Arc::new(MmapBytes(d.maps[en.file].clone()));
                let all = QMatrix::new(
                    en.dtype,
                    num_experts * total_rows,
                    cols,
                    Bytes::from_arc(map, en.range.clone()),
                )
                .map_err(|er| self.tensor_err(&name, er.to_string()))?;
                Ok(all.rows_slice(e * total_rows + row0, rows))
            }
        }
    }
}
