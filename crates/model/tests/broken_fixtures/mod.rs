//! The four broken-on-purpose GGUF fixtures of `tests/fixtures/broken/`, rebuilt at test time
//! from their healthy sources in `tests/fixtures/models/` instead of being committed (the
//! repository must stay small; the HF reference dumps and `manifest.json` stay committed).
//!
//! Each file is its source with exactly one edit, the same as `tools/break_fixture.py` makes
//! (its docstring and `tests/fixtures/broken/README.md` say why each defect matters):
//! - kv_b scrambled: `attn_kv_b` rows [N*(P+V), L] regrouped from per head `[K_h; V_h]` to
//!   `cat(K_0..K_{N-1}, V_0..V_{N-1})`;
//! - yarn twice: `rope.scaling.yarn_log_multiplier` = f32(f64(good) / 0.1) (1.0, not 0.1);
//! - no expert scale: `expert_weights_scale` removed;
//! - rope permuted: the R rope rows of every `attn_q_b` head and the R k_pe rows of
//!   `attn_kv_a_mqa` reordered from interleaved pairs to half-split order
//!   (new row j = old row `[0, 2, .., R-2, 1, 3, .., R-1][j]`).
//!
//! Invariants: the rewrite lays the file out the way gguf-py's `GGUFWriter` does
//! (`general.architecture` first, then every other key in source order with its source type,
//! tensors in source order, 32-byte alignment), so the output is byte-identical to the Python
//! script's; `doctor.rs` checks that against the sha256 in `manifest.json`. Every tensor edit is
//! a row permutation that moves at least one row (a no-op edit would leave a healthy file);
//! key edits name keys the source has.

#![allow(dead_code)]

use mlaserve_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use std::borrow::Cow;
use std::path::PathBuf;

/// One broken fixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// `deepseek_v3-legacy-kvb-scrambled.gguf` from `deepseek_v3-legacy-f32.gguf`.
    KvbScrambled,
    /// `deepseek_v3-yarn-twice.gguf` from `deepseek_v3-f32.gguf`.
    YarnTwice,
    /// `deepseek_v3-no-expert-scale.gguf` from `deepseek_v3-f32.gguf`.
    NoExpertScale,
    /// `glm_moe_dsa-rope-permuted.gguf` from `glm_moe_dsa-f32.gguf`.
    RopePermuted,
}

/// A broken file written into its own temporary directory (removed on drop).
pub struct Built {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

/// `tests/fixtures/` of the repository.
pub fn fixtures_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A committed file of `tests/fixtures/broken/` (the reference dumps, `manifest.json`).
pub fn committed(file: &str) -> PathBuf {
    fixtures_root().join("broken").join(file)
}

impl Defect {
    pub const ALL: [Defect; 4] = [
        Defect::KvbScrambled,
        Defect::YarnTwice,
        Defect::NoExpertScale,
        Defect::RopePermuted,
    ];

    /// The file name `break_fixture.py` and `manifest.json` use.
    pub fn file_name(self) -> &'static str {
        match self {
            Defect::KvbScrambled => "deepseek_v3-legacy-kvb-scrambled.gguf",
            Defect::YarnTwice => "deepseek_v3-yarn-twice.gguf",
            Defect::NoExpertScale => "deepseek_v3-no-expert-scale.gguf",
            Defect::RopePermuted => "glm_moe_dsa-rope-permuted.gguf",
        }
    }

    /// The healthy source, relative to `tests/fixtures/` (as in `manifest.json`'s `source`).
    pub fn source(self) -> &'static str {
        match self {
            Defect::KvbScrambled => "models/deepseek_v3/deepseek_v3-legacy-f32.gguf",
            Defect::YarnTwice | Defect::NoExpertScale => "models/deepseek_v3/deepseek_v3-f32.gguf",
            Defect::RopePermuted => "models/glm_moe_dsa/glm_moe_dsa-f32.gguf",
        }
    }

    pub fn source_path(self) -> PathBuf {
        fixtures_root().join(self.source())
    }

    /// The broken file's bytes.
    pub fn bytes(self) -> Vec<u8> {
        let path = self.source_path();
        let src = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let edit = match self {
            Defect::KvbScrambled => kvb_scrambled(&src),
            Defect::YarnTwice => yarn_twice(&src),
            Defect::NoExpertScale => no_expert_scale(&src),
            Defect::RopePermuted => rope_permuted(&src),
        };
        rewrite(&src, &edit).unwrap_or_else(|e| panic!("{}: {e}", self.file_name()))
    }

    /// Writes the broken file into a fresh temporary directory under its usual name.
    pub fn build(self) -> Built {
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let path = dir.path().join(self.file_name());
        std::fs::write(&path, self.bytes())
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        Built { _dir: dir, path }
    }
}

/// A metadata edit.
enum KeyEdit {
    Set(Value),
    Drop,
}

/// One defect: key edits and row permutations (tensor name -> `perm`, new row j = old row
/// `perm[j]`, rows in torch order: the outermost dim).
#[derive(Default)]
struct Edit {
    keys: Vec<(String, KeyEdit)>,
    rows: Vec<(String, Vec<usize>)>,
}

/// Required unsigned metadata `key`.
fn u(f: &GgufFile, key: &str) -> usize {
    f.get_usize(key)
        .unwrap_or_else(|e| panic!("{}: {e}", f.path().display()))
        .unwrap_or_else(|| panic!("{}: source has no {key}", f.path().display()))
}

fn arch(f: &GgufFile) -> String {
    f.architecture()
        .unwrap_or_else(|| panic!("{}: no general.architecture", f.path().display()))
        .to_string()
}

/// `[0, 2, .., r-2, 1, 3, .., r-1]`: interleaved rope pairs (2i, 2i+1) -> half-split (i, i + r/2).
fn halfsplit_order(r: usize) -> Vec<usize> {
    assert!(r.is_multiple_of(2), "rope dimension {r} is odd");
    (0..r).step_by(2).chain((1..r).step_by(2)).collect()
}

/// `blk.<digits>.<suffix>`.
fn is_block_tensor(name: &str, suffix: &str) -> bool {
    name.strip_prefix("blk.")
        .and_then(|rest| rest.strip_suffix(suffix))
        .and_then(|layer| layer.strip_suffix('.'))
        .is_some_and(|layer| !layer.is_empty() && layer.bytes().all(|b| b.is_ascii_digit()))
}

fn n_rows(f: &GgufFile, name: &str) -> usize {
    f.tensor(name).expect("tensor listed by the file").n_rows() as usize
}

/// attn_kv_b [N*(P+V), L]: per head [K_h; V_h] -> cat(all K_h, all V_h).
fn kvb_scrambled(f: &GgufFile) -> Edit {
    let a = arch(f);
    let n = u(f, &format!("{a}.attention.head_count"));
    let r = u(f, &format!("{a}.rope.dimension_count"));
    assert!(
        f.get(&format!("{a}.attention.key_length_mla")).is_none(),
        "kv_b scramble needs a legacy (attn_kv_b) file; this one has key_length_mla"
    );
    let p = u(f, &format!("{a}.attention.key_length")) - r; // legacy: key_length = nope + rope
    let v = u(f, &format!("{a}.attention.value_length"));
    let mut perm: Vec<usize> = (0..n).flat_map(|h| h * (p + v)..h * (p + v) + p).collect();
    perm.extend((0..n).flat_map(|h| h * (p + v) + p..(h + 1) * (p + v)));
    let mut edit = Edit::default();
    for t in f.tensors() {
        if t.name.ends_with(".attn_kv_b.weight") {
            let rows = n_rows(f, &t.name);
            assert_eq!(rows, n * (p + v), "{}: rows != n_head*(nope+v)", t.name);
            edit.rows.push((t.name.clone(), perm.clone()));
        }
    }
    assert!(!edit.rows.is_empty(), "no attn_kv_b tensor in the source");
    edit
}

/// yarn_log_multiplier = f32(good / 0.1) (= mscale_all_dim) instead of good = 0.1 * mscale_all_dim.
fn yarn_twice(f: &GgufFile) -> Edit {
    let key = format!("{}.rope.scaling.yarn_log_multiplier", arch(f));
    let good = match f.get(&key) {
        Some(Value::F32(x)) => f64::from(*x),
        other => panic!("source {key} is {other:?}, expected an f32"),
    };
    Edit {
        keys: vec![(key, KeyEdit::Set(Value::F32((good / 0.1) as f32)))],
        rows: Vec::new(),
    }
}

fn no_expert_scale(f: &GgufFile) -> Edit {
    let key = format!("{}.expert_weights_scale", arch(f));
    assert!(f.get(&key).is_some(), "source has no {key}");
    Edit {
        keys: vec![(key, KeyEdit::Drop)],
        rows: Vec::new(),
    }
}

/// q_b [N*(P+R), Lq]: per head the last R rows; kv_a [L+R, H]: the last R rows (k_pe).
fn rope_permuted(f: &GgufFile) -> Edit {
    let a = arch(f);
    let n = u(f, &format!("{a}.attention.head_count"));
    let r = u(f, &format!("{a}.rope.dimension_count"));
    let p = u(f, &format!("{a}.attention.key_length_mla")) - r;
    let kv_lora_rank = u(f, &format!("{a}.attention.kv_lora_rank"));
    let order = halfsplit_order(r);
    let mut edit = Edit::default();
    for t in f.tensors() {
        let rows = n_rows(f, &t.name);
        if is_block_tensor(&t.name, "attn_q_b.weight") {
            assert_eq!(rows, n * (p + r), "{}: rows != n_head*(nope+rope)", t.name);
            let perm = (0..n)
                .flat_map(|h| {
                    let base = h * (p + r);
                    (base..base + p).chain(order.iter().map(move |&j| base + p + j))
                })
                .collect();
            edit.rows.push((t.name.clone(), perm));
        } else if is_block_tensor(&t.name, "attn_kv_a_mqa.weight") {
            assert_eq!(rows, kv_lora_rank + r, "{}: rows != kv_lora+rope", t.name);
            let perm = (0..kv_lora_rank)
                .chain(order.iter().map(|&j| kv_lora_rank + j))
                .collect();
            edit.rows.push((t.name.clone(), perm));
        }
    }
    assert!(
        edit.rows
            .iter()
            .any(|(name, _)| name.ends_with("attn_q_b.weight")),
        "no attn_q_b tensor in the source (a q_lora-less file needs attn_q)"
    );
    edit
}

/// `bytes` with its rows reordered by `perm` (new row j = old row `perm[j]`).
fn permute_rows(bytes: &[u8], row_bytes: usize, perm: &[usize]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &j in perm {
        out.extend_from_slice(&bytes[j * row_bytes..(j + 1) * row_bytes]);
    }
    out
}

/// The source rewritten with `edit`, laid out as gguf-py's GGUFWriter does (module doc).
fn rewrite(src: &GgufFile, edit: &Edit) -> Result<Vec<u8>, String> {
    for (key, _) in &edit.keys {
        if src.get(key).is_none() {
            return Err(format!("cannot edit missing key {key}"));
        }
    }
    for (name, _) in &edit.rows {
        if src.tensor(name).is_none() {
            return Err(format!("cannot edit missing tensor {name}"));
        }
    }
    let arch = src.architecture().ok_or("no general.architecture")?;
    let mut w = GgufWriter::new();
    let err = |e: mlaserve_gguf::GgufError| e.to_string();
    w.add_metadata("general.architecture", Value::String(arch.to_string()))
        .map_err(err)?;
    for (key, value) in src.metadata() {
        if key == "general.architecture" {
            continue;
        }
        match edit.keys.iter().find(|(k, _)| k == key) {
            Some((_, KeyEdit::Drop)) => continue,
            Some((_, KeyEdit::Set(new))) => {
                if new.value_type() != value.value_type() {
                    return Err(format!(
                        "{key}: edit changes the type {} -> {}",
                        value.type_name(),
                        new.type_name()
                    ));
                }
                w.add_metadata(key, new.clone()).map_err(err)?
            }
            None => w.add_metadata(key, value.clone()).map_err(err)?,
        };
    }
    for t in src.tensors() {
        if t.ggml_type != GgmlType::F32 {
            return Err(format!(
                "expects an all-F32 source, {} is {}",
                t.name, t.ggml_type
            ));
        }
        let data = src.tensor_data(t);
        let data: Cow<[u8]> = match edit.rows.iter().find(|(n, _)| *n == t.name) {
            None => Cow::Borrowed(data),
            Some((_, perm)) => {
                let mut sorted = perm.clone();
                sorted.sort_unstable();
                if sorted != (0..t.n_rows() as usize).collect::<Vec<_>>() {
                    return Err(format!("{}: edit is not a permutation of its rows", t.name));
                }
                let out = permute_rows(data, t.row_bytes() as usize, perm);
                if out == data {
                    return Err(format!("{}: edit is a no-op", t.name));
                }
                Cow::Owned(out)
            }
        };
        w.add_tensor(&t.name, t.ggml_type, &t.dims, data)
            .map_err(err)?;
    }
    Ok(w.to_bytes())
}

#[test]
fn halfsplit_order_of_eight() {
    assert_eq!(halfsplit_order(8), [0, 2, 4, 6, 1, 3, 5, 7]);
}

#[test]
fn block_tensor_names() {
    assert!(is_block_tensor("blk.12.attn_q_b.weight", "attn_q_b.weight"));
    assert!(!is_block_tensor("blk..attn_q_b.weight", "attn_q_b.weight"));
    assert!(!is_block_tensor(
        "blk.1.x.attn_q_b.weight",
        "attn_q_b.weight"
    ));
    assert!(!is_block_tensor("blk.1.attn_q_a.weight", "attn_q_b.weight"));
}
