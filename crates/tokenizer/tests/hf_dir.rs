//! `Tokenizer::from_hf_dir` on edited copies of a fixture's HF directory: which file wins for the
//! chat template, BOS handling from `add_bos_token`, EOS ids from generation_config.json /
//! config.json, and errors that name the bad file.

use std::path::{Path, PathBuf};

use mlaserve_tokenizer::{Tokenizer, TokenizerError};
use serde_json::{json, Value};

fn fixture_hf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/deepseek_v3/hf")
}

/// A temp dir holding the fixture's tokenizer.json (optionally edited) and the given extra files.
fn dir_with(
    edit_tokenizer: impl FnOnce(&mut Value),
    files: &[(&str, String)],
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut tj: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_hf().join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    edit_tokenizer(&mut tj);
    std::fs::write(dir.path().join("tokenizer.json"), tj.to_string()).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

const BOS: &str = "<｜begin▁of▁sentence｜>";
const EOS: &str = "<｜end▁of▁sentence｜>";

#[test]
fn tokenizer_json_alone_loads_without_template_or_eos() {
    let d = dir_with(|_| {}, &[]);
    let t = Tokenizer::from_hf_dir(d.path()).unwrap();
    assert!(t.chat_template().is_none() && t.chat_template_error().is_none());
    assert!(t.eos_ids().is_empty() && t.bos_id().is_none());
    // tokenizer.json's own post-processor still adds BOS.
    assert_eq!(t.encode("Hello", true).unwrap()[0], 0);
}

#[test]
fn add_bos_token_is_honoured_when_the_post_processor_lacks_it() {
    let cfg = json!({"bos_token": BOS, "eos_token": {"content": EOS, "special": true}, "add_bos_token": true}).to_string();
    let d = dir_with(
        |tj| tj["post_processor"] = Value::Null,
        &[("tokenizer_config.json", cfg)],
    );
    let t = Tokenizer::from_hf_dir(d.path()).unwrap();
    let plain = t.encode("Hello", false).unwrap();
    let with = t.encode("Hello", true).unwrap();
    assert_eq!(with[0], 0);
    assert_eq!(&with[1..], &plain[..]);
    assert_eq!(t.eos_ids(), [1]);
    // And not twice when the post-processor already adds it.
    let d = dir_with(
        |_| {},
        &[(
            "tokenizer_config.json",
            json!({"bos_token": BOS, "add_bos_token": true}).to_string(),
        )],
    );
    let t = Tokenizer::from_hf_dir(d.path()).unwrap();
    assert_eq!(
        t.encode("Hello", true)
            .unwrap()
            .iter()
            .filter(|&&i| i == 0)
            .count(),
        1
    );
}

#[test]
fn chat_template_sources_in_order_of_precedence() {
    let listed = json!({"chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "default {{ messages | length }}"}
    ]})
    .to_string();
    let d = dir_with(|_| {}, &[("tokenizer_config.json", listed.clone())]);
    let t = Tokenizer::from_hf_dir(d.path()).unwrap();
    assert_eq!(
        t.chat_template().unwrap().render(&[], false).unwrap(),
        "default 0"
    );
    let d = dir_with(
        |_| {},
        &[
            ("tokenizer_config.json", listed),
            ("chat_template.jinja", "from jinja file\n".into()),
        ],
    );
    let t = Tokenizer::from_hf_dir(d.path()).unwrap();
    assert_eq!(
        t.chat_template().unwrap().render(&[], false).unwrap(),
        "from jinja file"
    );
}

#[test]
fn eos_ids_come_from_generation_config_else_config() {
    let d = dir_with(
        |_| {},
        &[(
            "generation_config.json",
            json!({"eos_token_id": [1, 509]}).to_string(),
        )],
    );
    assert_eq!(
        Tokenizer::from_hf_dir(d.path()).unwrap().eos_ids(),
        [1, 509]
    );
    let d = dir_with(
        |_| {},
        &[("config.json", json!({"eos_token_id": 508}).to_string())],
    );
    assert_eq!(Tokenizer::from_hf_dir(d.path()).unwrap().eos_ids(), [508]);
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let e = Tokenizer::from_hf_dir(d.path()).unwrap_err();
    assert!(
        matches!(e, TokenizerError::Io { .. }) && e.to_string().contains("tokenizer.json"),
        "{e}"
    );

    let d = dir_with(|_| {}, &[("tokenizer_config.json", "{not json".into())]);
    let e = Tokenizer::from_hf_dir(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("invalid JSON"),
        "{e}"
    );

    let d = dir_with(
        |_| {},
        &[(
            "tokenizer_config.json",
            json!({"eos_token": "<nope>"}).to_string(),
        )],
    );
    let e = Tokenizer::from_hf_dir(d.path()).unwrap_err().to_string();
    assert!(e.contains("eos_token") && e.contains("<nope>"), "{e}");

    let d = dir_with(
        |_| {},
        &[(
            "generation_config.json",
            json!({"eos_token_id": 99999}).to_string(),
        )],
    );
    let e = Tokenizer::from_hf_dir(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("99999") && e.contains("out of range"),
        "{e}"
    );

    let d = dir_with(
        |_| {},
        &[(
            "generation_config.json",
            json!({"eos_token_id": "x"}).to_string(),
        )],
    );
    let e = Tokenizer::from_hf_dir(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("eos_token_id"),
        "{e}"
    );

    std::fs::write(d.path().join("tokenizer.json"), "{}").unwrap();
    let e = Tokenizer::from_hf_dir(d.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}
