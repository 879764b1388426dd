//! Real vocabularies: llama.cpp's `models/ggml-vocab-*.gguf` with their `.inp`/`.out` files, whose
//! ids HF `tokenizer.encode(text, add_special_tokens=False)` produced (convert_hf_to_gguf_update.py).
//! They cover the GPT-2, Llama-3, Qwen2, DeepSeek-LLM, DeepSeek-Coder, StarCoder, Falcon, ...
//! pre-tokenizers with the models' own vocabularies and merges.
//!
//! The files are llama.cpp's (not vendored here: ~40 MB). The directory comes from
//! `MLASERVE_LLAMA_VOCAB_DIR`, else the llama.cpp checkout this project was developed beside; when
//! neither exists the test says so and checks nothing (set `MLASERVE_REQUIRE_LLAMA_VOCABS=1` to
//! make that a failure, e.g. in CI with the files present).

use std::path::PathBuf;
use std::sync::Arc;

use mlaserve_gguf::GgufFile;
use mlaserve_tokenizer::{DecodeStream, Tokenizer, TokenizerError};

const DEFAULT_DIR: &str = "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models";

fn vocab_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MLASERVE_LLAMA_VOCAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    if dir.join("ggml-vocab-gpt-2.gguf").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("MLASERVE_REQUIRE_LLAMA_VOCABS").is_none(),
        "llama.cpp vocab files not found in {}",
        dir.display()
    );
    eprintln!(
        "skipping: llama.cpp vocab files not found in {} (set MLASERVE_LLAMA_VOCAB_DIR)",
        dir.display()
    );
    None
}

/// The byte-level BPE vocabularies, and the ones that must be refused (other tokenizer families).
const BPE: &[&str] = &[
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "deepseek-llm",
    "deepseek-coder",
    "starcoder",
    "refact",
    "falcon",
    "mpt",
    "command-r",
];
const NOT_BPE: &[&str] = &["llama-spm", "phi-3", "bert-bge"];

fn cases(dir: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    // The .inp ends with a separator, so its last piece is empty.
    assert_eq!(
        texts.len(),
        ids.len() + 1,
        "{name}: {} texts vs {} id lines",
        texts.len(),
        ids.len()
    );
    texts
        .into_iter()
        .zip(ids)
        .map(|(t, i)| (t.to_string(), i))
        .collect()
}

#[test]
#[ignore = "needs llama.cpp's models/ggml-vocab-*.gguf: set MLASERVE_LLAMA_VOCAB_DIR, run with --ignored"]
fn gguf_vocabularies_encode_like_hf() {
    let Some(dir) = vocab_dir() else {
        panic!("llama.cpp vocab files not found: set MLASERVE_LLAMA_VOCAB_DIR")
    };
    let mut failures = Vec::new();
    for name in BPE {
        let file = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{name}: {e}")));
        for (text, want) in cases(&dir, name) {
            let got = tok.encode(&text, false).unwrap();
            if got != want {
                failures.push(format!("{name} {text:?}:\n  got  {got:?}\n  want {want:?}"));
                continue;
            }
            // Decoding gives the text back (these vocabularies have every byte).
            assert_eq!(tok.decode(&got, false).unwrap(), text, "{name} decode");
            let mut stream = DecodeStream::new(tok.clone(), false);
            let mut streamed = String::new();
            for &id in &got {
                if let Some(piece) = stream.step(id).unwrap() {
                    assert!(
                        !piece.contains('\u{FFFD}'),
                        "{name} {text:?}: partial char {piece:?}"
                    );
                    streamed.push_str(&piece);
                }
            }
            streamed.push_str(&stream.finish().unwrap());
            assert_eq!(streamed, text, "{name} stream");
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
#[ignore = "needs llama.cpp's models/ggml-vocab-*.gguf: set MLASERVE_LLAMA_VOCAB_DIR, run with --ignored"]
fn other_tokenizer_families_are_refused_by_name() {
    let Some(dir) = vocab_dir() else {
        panic!("llama.cpp vocab files not found: set MLASERVE_LLAMA_VOCAB_DIR")
    };
    for name in NOT_BPE {
        let file = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).unwrap();
        match Tokenizer::from_gguf(&file) {
            Err(e @ TokenizerError::UnsupportedModel { .. }) => {
                assert!(e.to_string().contains("unsupported tokenizer model"), "{e}")
            }
            other => panic!("{name}: expected UnsupportedModel, got {other:?}"),
        }
    }
}

/// Throughput on a 128k-token vocabulary (Llama-3's). Run with
/// `cargo test --release -p mlaserve-tokenizer --test llama_vocabs -- --ignored --nocapture`.
#[test]
#[ignore = "timing, not a check"]
fn throughput() {
    let Some(dir) = vocab_dir() else {
        panic!("llama.cpp vocab files not found: set MLASERVE_LLAMA_VOCAB_DIR")
    };
    let t0 = std::time::Instant::now();
    let file = GgufFile::open(dir.join("ggml-vocab-llama-bpe.gguf")).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    let load = t0.elapsed();
    let text: String = cases(&dir, "llama-bpe")
        .into_iter()
        .map(|(t, _)| t)
        .collect::<Vec<_>>()
        .join(" ")
        .repeat(50);
    let t0 = std::time::Instant::now();
    let ids = tok.encode(&text, false).unwrap();
    let enc = t0.elapsed();
    let t0 = std::time::Instant::now();
    let mut stream = DecodeStream::new(tok.clone(), false);
    let mut n = 0;
    for &id in &ids {
        n += stream.step(id).unwrap().map_or(0, |s| s.len());
    }
    let dec = t0.elapsed();
    assert!(n > 0);
    eprintln!(
        "vocab {} tokens: load {load:?}; encode {} bytes -> {} ids in {enc:?} ({:.1} MB/s); stream-decode {:.2} us/token",
        tok.vocab_size(),
        text.len(),
        ids.len(),
        text.len() as f64 / enc.as_secs_f64() / 1e6,
        dec.as_secs_f64() * 1e6 / ids.len() as f64
    );
}
