//! Split GGUF models (`model-00001-of-00003.gguf`, as written by llama.cpp's `gguf-split`).
//!
//! Every shard is a complete GGUF file with `split.no` (0-based), `split.count` and, in the
//! first shard, `split.tensors.count`. The first shard carries the model metadata; tensor
//! offsets are relative to each shard's own data section.
//!
//! Invariants of an opened [`GgufSplit`]: shard `i` has `split.no == i` and the same
//! `split.count` as the others; a tensor name occurs in exactly one shard; the total tensor
//! count equals `split.tensors.count` when the first shard states it. A file without
//! `split.count` (or with 1) is a split of one shard.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::file::{GgufFile, TensorBytes};
use crate::tensor_info::TensorInfo;

/// Metadata key: this shard's 0-based index.
pub const SPLIT_NO: &str = "split.no";
/// Metadata key: number of shards.
pub const SPLIT_COUNT: &str = "split.count";
/// Metadata key: number of tensors over all shards.
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The name of shard `split_no` (0-based) of `split_count`: `{prefix}-00001-of-00003.gguf`
/// for `split_no == 0`, as llama.cpp names them.
pub fn split_path(prefix: &str, split_no: usize, split_count: usize) -> String {
    format!("{prefix}-{:05}-of-{split_count:05}.gguf", split_no + 1)
}

/// A model stored as one GGUF file or as several shards, opened as one.
#[derive(Debug)]
pub struct GgufSplit {
    shards: Vec<GgufFile>,
    /// Tensor name → (shard, index in that shard's tensors).
    index: HashMap<String, (usize, usize)>,
}

fn split_err(file: &Path, message: String) -> GgufError {
    GgufError::Split {
        file: file.display().to_string(),
        message,
    }
}

impl GgufSplit {
    /// Opens `path` and, when its `split.count` is above 1, every sibling shard named by
    /// [`split_path`] in the same directory. `path` may be any one of the shards.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let file = GgufFile::open(path)?;
        let count = file.get_usize(SPLIT_COUNT)?.unwrap_or(1);
        if count <= 1 {
            return Self::from_shards(vec![file]);
        }
        let no = file.get_usize(SPLIT_NO)?.unwrap_or(0);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let suffix = format!("-{:05}-of-{count:05}.gguf", no + 1);
        let prefix = name.strip_suffix(&suffix).ok_or_else(|| {
            split_err(
                path,
                format!("split.no {no} of {count}, but the file name does not end in {suffix:?}"),
            )
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut opened = Some(file);
        let mut shards = Vec::with_capacity(count.min(1024));
        for i in 0..count {
            let shard = if i == no {
                opened.take().expect("shard `no` is opened once")
            } else {
                let shard_path: PathBuf = dir.join(split_path(prefix, i, count));
                GgufFile::open(&shard_path)?
            };
            shards.push(shard);
        }
        Self::from_shards(shards)
    }

    /// Joins already opened shards, given in order; checks the split keys and tensor names.
    pub fn from_shards(shards: Vec<GgufFile>) -> Result<Self, GgufError> {
        let Some(first) = shards.first() else {
            return Err(split_err(
                Path::new("(none)"),
                "no shards given".to_string(),
            ));
        };
        let count = shards.len();
        let mut index = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            if count > 1 {
                let no = shard.get_usize(SPLIT_NO)?;
                let declared = shard.get_usize(SPLIT_COUNT)?;
                if no != Some(i) || declared != Some(count) {
                    return Err(split_err(
                        shard.path(),
                        format!("is shard {i} of {count}, but says split.no {no:?}, split.count {declared:?}"),
                    ));
                }
            }
            for (j, t) in shard.tensors().iter().enumerate() {
                if let Some((other, _)) = index.insert(t.name.clone(), (i, j)) {
                    return Err(split_err(
                        shard.path(),
                        format!(
                            "tensor {:?} is also in {}",
                            t.name,
                            shards[other].path().display()
                        ),
                    ));
                }
            }
        }
        if let Some(expected) = first.get_usize(SPLIT_TENSORS_COUNT)? {
            if expected != index.len() {
                return Err(split_err(
                    first.path(),
                    format!(
                        "split.tensors.count is {expected}, but the shards hold {} tensors",
                        index.len()
                    ),
                ));
            }
        }
        Ok(GgufSplit { shards, index })
    }

    /// The shards in order; the first holds the model metadata.
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    /// The first shard: the one with the model metadata.
    pub fn first(&self) -> &GgufFile {
        &self.shards[0]
    }

    /// Number of tensors over all shards.
    pub fn n_tensors(&self) -> usize {
        self.index.len()
    }

    /// Every tensor with the shard that holds it, shard by shard in file order.
    pub fn tensors(&self) -> impl Iterator<Item = (&GgufFile, &TensorInfo)> {
        self.shards
            .iter()
            .flat_map(|s| s.tensors().iter().map(move |t| (s, t)))
    }

    /// The tensor named `name` and the shard that holds it.
    pub fn tensor(&self, name: &str) -> Option<(&GgufFile, &TensorInfo)> {
        let &(s, i) = self.index.get(name)?;
        Some((&self.shards[s], &self.shards[s].tensors()[i]))
    }

    /// The bytes of tensor `name` (zero-copy, owning its shard's map).
    pub fn tensor_bytes(&self, name: &str) -> Option<TensorBytes> {
        self.tensor(name).map(|(shard, t)| shard.tensor_bytes(t))
    }
}
