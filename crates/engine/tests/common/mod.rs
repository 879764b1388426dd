//! Shared helpers of the end-to-end tests: the real tiny fixture models of
//! tests/fixtures/models and their HF greedy references. No mock model anywhere.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use mlaserve_engine::{
    collect_output, start_engine, EngineConfig, EngineHandle, GenerateOutput, GenerateRequest,
    SamplingParams,
};
use mlaserve_model::{LoadOptions, Model};
use mlaserve_tokenizer::Tokenizer;

pub const MODELS: [&str; 3] = ["deepseek_v2", "deepseek_v3", "glm_moe_dsa"];

pub fn fixture_dir(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(model)
}

/// Loads `<model>-f32.gguf` and its GGUF tokenizer.
pub fn load(model: &str) -> (Model, Arc<Tokenizer>) {
    let path = fixture_dir(model).join(format!("{model}-f32.gguf"));
    let m = Model::load(&path, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(m.gguf().expect("a GGUF model"))
        .unwrap_or_else(|e| panic!("tokenizer of {model}: {e}"));
    (m, Arc::new(tok))
}

/// A small test engine: 4-token blocks so every prompt spans several blocks.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 16,
        max_num_batched_tokens: 512,
        block_size: 4,
        num_blocks: Some(256),
        max_model_len: Some(256),
        enable_prefix_caching: false,
        seed: Some(0),
        ..EngineConfig::default()
    }
}

pub fn start(model: &str, cfg: EngineConfig) -> EngineHandle {
    let (m, tok) = load(model);
    start_engine(m, tok, cfg).unwrap_or_else(|e| panic!("starting the engine on {model}: {e}"))
}

/// HF greedy references: prompts and 16 greedy ids per prompt (EOS ignored), f32 weights.
pub struct Reference {
    pub prompts: BTreeMap<String, Vec<u32>>,
    pub greedy: BTreeMap<String, Vec<u32>>,
}

impl Reference {
    pub fn load(model: &str) -> Self {
        let path = fixture_dir(model).join("reference.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v: serde_json::Value = serde_json::from_str(&text).expect("reference.json parses");
        let ids = |x: &serde_json::Value| -> BTreeMap<String, Vec<u32>> {
            x.as_object()
                .expect("an object of id lists")
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_array()
                            .unwrap()
                            .iter()
                            .map(|i| i.as_u64().unwrap() as u32)
                            .collect(),
                    )
                })
                .collect()
        };
        Self {
            prompts: ids(&v["prompts"]),
            greedy: ids(&v["variants"]["f32"]["greedy"]),
        }
    }
}

/// Greedy, EOS ignored (as the references were made).
pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
}

pub fn run(handle: &EngineHandle, prompt: &[u32], params: SamplingParams) -> GenerateOutput {
    let stream = handle
        .add(GenerateRequest {
            prompt_tokens: prompt.to_vec(),
            params,
        })
        .expect("request accepted");
    collect_output(stream).expect("request completes")
}

/// Runs all requests at once (batched in the engine), outputs in request order.
pub fn run_batch(
    handle: &EngineHandle,
    reqs: Vec<(Vec<u32>, SamplingParams)>,
) -> Vec<GenerateOutput> {
    let reqs = reqs
        .into_iter()
        .map(|(prompt_tokens, params)| GenerateRequest {
            prompt_tokens,
            params,
        })
        .collect();
    handle
        .generate_blocking(reqs)
        .into_iter()
        .map(|r| r.expect("request completes"))
        .collect()
}

/// Polls `cond` for up to 10 s.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}
