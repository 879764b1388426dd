//! The bundled default model (models/default.gguf, a trained GLM-5-architecture model) against
//! transformers: tokenization, chat template, and greedy continuations through the engine.
//!
//! `tests/fixtures/demo/reference.json` was made by HF from the GGUF's own weights in float32.
//! Only the first `n_defined` greedy ids of each prompt are defined (after an EOS the untrained
//! pad embedding makes later steps arbitrary ties). Exact comparison uses the dequantized
//! (f32-arithmetic) reading of the BF16 file, which is what HF computed; the file as served
//! (activations rounded to bf16) must still give the same answer up to the first stop token.

use mlaserve_engine::{start_engine, EngineConfig, GenerateRequest, SamplingParams};
use mlaserve_model::{LoadOptions, Model};
use mlaserve_tokenizer::{ChatMessage, Tokenizer};
use std::path::PathBuf;
use std::sync::Arc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reference() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/demo/reference.json")).unwrap(),
    )
    .unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn run(dequantize: bool) -> Vec<(String, Vec<u32>, Vec<u32>, usize)> {
    let path = root().join("models/default.gguf");
    let model = Model::load(
        &path,
        &LoadOptions {
            dequantize,
            ..Default::default()
        },
    )
    .unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf().unwrap()).unwrap());
    let cfg = EngineConfig {
        num_blocks: Some(256),
        block_size: 16,
        ..Default::default()
    };
    let handle = start_engine(model, tok, cfg).unwrap();
    let r = reference();
    let prompts: Vec<(String, serde_json::Value)> = r["prompts"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let reqs = prompts
        .iter()
        .map(|(_, p)| GenerateRequest {
            prompt_tokens: ids(&p["prompt_ids"]),
            params: SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(p["n_defined"].as_u64().unwrap() as usize)
            },
        })
        .collect();
    let outs = handle.generate_blocking(reqs);
    handle.shutdown();
    prompts
        .into_iter()
        .zip(outs)
        .map(|((name, p), out)| {
            let n = p["n_defined"].as_u64().unwrap() as usize;
            let want = ids(&p["greedy_ids"])[..n].to_vec();
            let stop = p["first_stop_index"]
                .as_u64()
                .map_or(n, |i| i as usize + 1)
                .min(n);
            (name, out.unwrap().token_ids, want, stop)
        })
        .collect()
}

#[test]
fn greedy_equals_hf_on_the_dequantized_weights() {
    for (name, got, want, _) in run(true) {
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn served_bf16_gives_hfs_answers() {
    for (name, got, want, stop) in run(false) {
        assert_eq!(got[..stop], want[..stop], "{name}");
    }
}

#[test]
fn tokenizer_and_chat_template_match_transformers() {
    let path = root().join("models/default.gguf");
    let file = mlaserve_model::gguf::GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let r = reference();
    for (name, p) in r["prompts"].as_object().unwrap() {
        let text = p["prompt_text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&p["prompt_ids"]),
            "{name}"
        );
    }
    let tmpl = tok
        .chat_template()
        .expect("the demo model ships a chat template");
    for case in r["chat_templates"].as_array().unwrap() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let got = tmpl
            .render(&msgs, case["add_generation_prompt"].as_bool().unwrap())
            .unwrap();
        assert_eq!(got, case["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&got, false).unwrap(), ids(&case["ids"]));
    }
}
