//! Shared helpers of the model tests: fixture paths, HF reference logits, error metrics.
#![allow(dead_code)]

use mlaserve_model::{LoadOptions, Model};
use std::collections::HashMap;
use std::path::PathBuf;

/// The three fixture families; every test covers all of them.
pub const MODELS: &[&str] = &["deepseek_v2", "deepseek_v3", "glm_moe_dsa"];

pub fn fixture_dir(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(model)
}

pub fn load(model: &str, file: &str) -> Model {
    load_with(model, file, &LoadOptions::default())
}

pub fn load_with(model: &str, file: &str, opts: &LoadOptions) -> Model {
    let p = fixture_dir(model).join(file);
    Model::load(&p, opts).unwrap_or_else(|e| panic!("loading {}: {e}", p.display()))
}

/// HF references of one fixture model.
pub struct Reference {
    /// prompt name -> prompt ids
    pub prompts: Vec<(String, Vec<u32>)>,
    /// variant -> prompt -> greedy ids
    pub greedy: HashMap<String, HashMap<String, Vec<u32>>>,
    /// "<variant>.<prompt>" -> [rows, vocab] logits
    pub logits: HashMap<String, Vec<f32>>,
}

impl Reference {
    pub fn load(model: &str) -> Reference {
        let dir = fixture_dir(model);
        let j: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("reference.json")).expect("reference.json"),
        )
        .unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let mut prompts: Vec<(String, Vec<u32>)> = j["prompts"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), ids(v)))
            .collect();
        prompts.sort_by_key(|(_, v)| v.len());
        let mut greedy = HashMap::new();
        for (variant, v) in j["variants"].as_object().unwrap() {
            let g = v["greedy"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, x)| (k.clone(), ids(x)))
                .collect();
            greedy.insert(variant.clone(), g);
        }
        let bytes =
            std::fs::read(dir.join("reference.safetensors")).expect("reference.safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let logits = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let data = view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                (name, data)
            })
            .collect();
        Reference {
            prompts,
            greedy,
            logits,
        }
    }

    /// Input ids for (variant, prompt): prompt + greedy[:-1].
    pub fn input(&self, variant: &str, prompt: &str) -> Vec<u32> {
        let p = &self.prompts.iter().find(|(n, _)| n == prompt).unwrap().1;
        let g = &self.greedy[variant][prompt];
        p.iter().chain(&g[..g.len() - 1]).copied().collect()
    }
}

/// Max over rows of (max |a - b| over the row) / (max |b| over the row).
pub fn max_rel_err(a: &[f32], b: &[f32], vocab: usize) -> f32 {
    assert_eq!(a.len(), b.len(), "logit counts differ");
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
        })
        .fold(0f32, f32::max)
}

/// Fraction of rows whose argmax agrees, and the median row relative error.
pub fn agreement(a: &[f32], b: &[f32], vocab: usize) -> (f32, f32) {
    let argmax = |x: &[f32]| {
        x.iter()
            .enumerate()
            .fold(0, |bi, (i, v)| if *v > x[bi] { i } else { bi })
    };
    let rows: Vec<(bool, f32)> = a
        .chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| (argmax(x) == argmax(y), max_rel_err(x, y, vocab)))
        .collect();
    let agree = rows.iter().filter(|r| r.0).count() as f32 / rows.len() as f32;
    let mut errs: Vec<f32> = rows.iter().map(|r| r.1).collect();
    errs.sort_by(f32::total_cmp);
    (agree, errs[errs.len() / 2])
}
