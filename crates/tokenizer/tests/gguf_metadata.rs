//! `Tokenizer::from_gguf` on GGUF files written with mlaserve_gguf's writer: a valid vocabulary
//! loads; every malformed tokenizer key (wrong value or element type, missing arrays, negative or
//! out-of-range ids, short arrays, bad byte tokens, bad merges) is an error naming the file and
//! the key — never a panic.

use mlaserve_gguf::{Array, GgufFile, GgufWriter, Value};
use mlaserve_tokenizer::{Tokenizer, TokenizerError};

/// GPT-2 printable-byte symbol of a byte (HF `bytes_to_unicode`).
fn byte_char(b: u8) -> char {
    let printable = |x: u8| {
        (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x)
    };
    if printable(b) {
        char::from(b)
    } else {
        char::from_u32(256 + (0..b).filter(|&x| !printable(x)).count() as u32).unwrap()
    }
}

/// A small valid vocabulary: 256 byte symbols, merges for "hello" and " the", two control tokens.
fn valid_metadata() -> Vec<(String, Value)> {
    let bl = |s: &str| s.bytes().map(byte_char).collect::<String>();
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges = Vec::new();
    for (a, b) in [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        (" ", "t"),
        (" t", "he"),
    ] {
        merges.push(format!("{} {}", bl(a), bl(b)));
        tokens.push(bl(&format!("{a}{b}")));
    }
    let mut types = vec![1i32; tokens.len()];
    tokens.extend(["<|bos|>".to_string(), "<|eos|>".to_string()]);
    types.extend([3, 3]);
    let n = tokens.len() as u32;
    vec![
        ("general.architecture".into(), Value::from("deepseek2")),
        ("deepseek2.vocab_size".into(), Value::U32(n)),
        ("tokenizer.ggml.model".into(), Value::from("gpt2")),
        ("tokenizer.ggml.pre".into(), Value::from("deepseek-v3")),
        ("tokenizer.ggml.tokens".into(), Value::from(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::from(types)),
        ("tokenizer.ggml.merges".into(), Value::from(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(n - 2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(n - 1)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)),
        (
            "tokenizer.chat_template".into(),
            Value::from(
                "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
            ),
        ),
    ]
}

fn file_of(meta: &[(String, Value)]) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k, v.clone()).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes(), "vocab-test.gguf").unwrap()
}

/// Loads the valid metadata after `edit`, expecting an error; returns its message.
fn error_after(edit: impl FnOnce(&mut Vec<(String, Value)>)) -> String {
    let mut meta = valid_metadata();
    edit(&mut meta);
    match Tokenizer::from_gguf(&file_of(&meta)) {
        Ok(_) => panic!("malformed metadata was accepted"),
        Err(e) => {
            let msg = e.to_string();
            if matches!(
                e,
                TokenizerError::BadMetadata { .. } | TokenizerError::MissingKey { .. }
            ) {
                assert!(msg.starts_with("vocab-test.gguf: "), "no file name: {msg}");
            }
            msg
        }
    }
}

fn set(meta: &mut [(String, Value)], key: &str, v: Value) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

fn remove(meta: &mut Vec<(String, Value)>, key: &str) {
    meta.retain(|(k, _)| k != key);
}

fn tokens_mut(meta: &mut [(String, Value)]) -> &mut Vec<String> {
    match &mut meta
        .iter_mut()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .unwrap()
        .1
    {
        Value::Array(Array::String(v)) => v,
        _ => unreachable!(),
    }
}

#[test]
fn valid_vocabulary_loads() {
    let tok = Tokenizer::from_gguf(&file_of(&valid_metadata())).unwrap();
    let ids = tok.encode("hello the", true).unwrap();
    assert_eq!(ids.len(), 3, "{ids:?}"); // <|bos|> hello Ġthe
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello the");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<|bos|>hello the");
    let chat = tok.chat_template().unwrap();
    let out = chat
        .render(&[mlaserve_tokenizer::ChatMessage::new("user", "hi")], false)
        .unwrap();
    assert_eq!(out, "<|bos|>hi<|eos|>");
}

#[test]
fn wrong_value_and_element_types_are_named() {
    let e = error_after(|m| set(m, "tokenizer.ggml.tokens", Value::from(vec![1i32, 2, 3])));
    assert!(
        e.contains("tokenizer.ggml.tokens")
            && e.contains("array of strings")
            && e.contains("[i32]"),
        "{e}"
    );
    // llama.cpp #26690: token types declared narrower than i32.
    let e = error_after(|m| set(m, "tokenizer.ggml.token_type", Value::from(vec![1u8; 264])));
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("array of i32") && e.contains("[u8]"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.merges", Value::from(vec![7u32])));
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("[u32]"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.model", Value::U32(2)));
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("a string"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.bos_token_id", Value::from("1")));
    assert!(
        e.contains("tokenizer.ggml.bos_token_id") && e.contains("integer"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.add_bos_token", Value::U8(1)));
    assert!(
        e.contains("tokenizer.ggml.add_bos_token") && e.contains("bool"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.chat_template", Value::I64(0)));
    assert!(e.contains("tokenizer.chat_template"), "{e}");
}

#[test]
fn missing_keys_are_named() {
    for key in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.model",
    ] {
        let e = error_after(|m| remove(m, key));
        assert!(e.contains(key) && e.contains("missing"), "{e}");
    }
}

#[test]
fn ids_out_of_range_or_negative_are_errors() {
    let e = error_after(|m| set(m, "tokenizer.ggml.eos_token_id", Value::U32(264)));
    assert!(
        e.contains("tokenizer.ggml.eos_token_id")
            && e.contains("264")
            && e.contains("out of range"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.bos_token_id", Value::I32(-1)));
    assert!(
        e.contains("tokenizer.ggml.bos_token_id") && e.contains("negative"),
        "{e}"
    );
    let e = error_after(|m| m.push(("tokenizer.ggml.eot_token_id".into(), Value::U64(u64::MAX))));
    assert!(e.contains("tokenizer.ggml.eot_token_id"), "{e}");
    let e = error_after(|m| set(m, "deepseek2.vocab_size", Value::U32(100_000)));
    assert!(
        e.contains("deepseek2.vocab_size") && e.contains("larger"),
        "{e}"
    );
}

#[test]
fn short_arrays_bad_merges_and_bad_byte_tokens_are_errors() {
    let e = error_after(|m| set(m, "tokenizer.ggml.token_type", Value::from(vec![1i32; 100])));
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("100 entries"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.merges", Value::from(vec!["nospace"])));
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("nospace"),
        "{e}"
    );
    let e = error_after(|m| set(m, "tokenizer.ggml.merges", Value::from(vec!["a zzz"])));
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    for bad in ["<0x-1>", "<0xZZ>"] {
        let e = error_after(|m| {
            tokens_mut(m)[262] = bad.to_string();
            let types = (0..264)
                .map(|i| if i == 262 { 6 } else { 1 })
                .collect::<Vec<i32>>();
            set(m, "tokenizer.ggml.token_type", Value::from(types));
        });
        assert!(
            e.contains("tokenizer.ggml.tokens") && e.contains(bad) && e.contains("<0xHH>"),
            "{e}"
        );
    }
    let e = error_after(|m| {
        set(
            m,
            "tokenizer.ggml.token_type",
            Value::from(vec![-3i32; 264]),
        )
    });
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("-3"),
        "{e}"
    );
}

#[test]
fn unsupported_model_and_unknown_pre_are_explained() {
    let e = error_after(|m| set(m, "tokenizer.ggml.model", Value::from("llama")));
    assert!(e.contains("unsupported tokenizer model `llama`"), "{e}");
    let e = error_after(|m| set(m, "tokenizer.ggml.pre", Value::from("brand-new")));
    assert!(
        e.contains("brand-new") && e.contains("known:") && e.contains("glm4"),
        "{e}"
    );
}
