//! The tiny fixture models (tests/fixtures/models/<name>/): their HF tokenizer directory and every
//! GGUF file converted from it must tokenize, decode and render chats exactly as transformers did
//! when `tools/make_fixtures.py` wrote `tokenizer_cases.json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlaserve_gguf::GgufFile;
use mlaserve_tokenizer::{ChatMessage, DecodeStream, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Cases {
    vocab_size: usize,
    bos_token: Option<String>,
    eos_token: Option<String>,
    encode_cases: Vec<EncodeCase>,
    chat_cases: Vec<ChatCase>,
}

#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids_add_special_tokens_true: Vec<u32>,
    ids_add_special_tokens_false: Vec<u32>,
    tokens: Vec<String>,
    decoded: String,
    decoded_skip_special_tokens: String,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    rendered: String,
    ids_of_rendered_add_special_tokens_false: Vec<u32>,
}

fn fixture_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("tokenizer_cases.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no tokenizer_cases.json under {}",
        root.display()
    );
    dirs
}

fn load_cases(dir: &Path) -> Cases {
    let text = std::fs::read_to_string(dir.join("tokenizer_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every tokenizer of a fixture: the HF directory, then each GGUF file.
fn tokenizers(dir: &Path) -> Vec<(String, Arc<Tokenizer>)> {
    let mut out = vec![(
        "hf".to_string(),
        Arc::new(
            Tokenizer::from_hf_dir(&dir.join("hf"))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
        ),
    )];
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    ggufs.sort();
    assert!(!ggufs.is_empty(), "{}: no GGUF files", dir.display());
    for p in ggufs {
        let file = GgufFile::open(&p).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        out.push((
            p.file_name().unwrap().to_string_lossy().into_owned(),
            Arc::new(tok),
        ));
    }
    out
}

fn check_encode(what: &str, tok: &Arc<Tokenizer>, cases: &Cases) {
    assert_eq!(tok.vocab_size(), cases.vocab_size, "{what}: vocab_size");
    let name_of = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i));
    // llama.cpp's GLM converter records `[gMASK]` as BOS although HF has none (and adds none:
    // add_bos_token is false, which the encode checks below verify).
    let gguf_without_hf_bos = what.ends_with(".gguf") && cases.bos_token.is_none();
    if !gguf_without_hf_bos {
        assert_eq!(name_of(tok.bos_id()), cases.bos_token, "{what}: bos");
    }
    let eos = cases.eos_token.as_deref().and_then(|t| tok.token_to_id(t));
    assert!(
        eos.is_some_and(|e| tok.eos_ids().contains(&e)),
        "{what}: eos {:?} not in {:?}",
        cases.eos_token,
        tok.eos_ids()
    );
    for c in &cases.encode_cases {
        let t = &c.text;
        assert_eq!(
            tok.encode(t, false).unwrap(),
            c.ids_add_special_tokens_false,
            "{what}: encode {t:?}"
        );
        assert_eq!(
            tok.encode(t, true).unwrap(),
            c.ids_add_special_tokens_true,
            "{what}: encode+special {t:?}"
        );
        let ids = &c.ids_add_special_tokens_false;
        let tokens: Vec<String> = ids.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
        assert_eq!(tokens, c.tokens, "{what}: tokens of {t:?}");
        assert_eq!(
            tok.decode(ids, false).unwrap(),
            c.decoded,
            "{what}: decode {t:?}"
        );
        assert_eq!(
            tok.decode(ids, true).unwrap(),
            c.decoded_skip_special_tokens,
            "{what}: decode skip {t:?}"
        );
        for (skip, want) in [(false, &c.decoded), (true, &c.decoded_skip_special_tokens)] {
            let mut stream = DecodeStream::new(tok.clone(), skip);
            let mut got = String::new();
            for &id in ids {
                if let Some(piece) = stream.step(id).unwrap() {
                    assert!(
                        !piece.contains('\u{FFFD}') || want.contains('\u{FFFD}'),
                        "{what}: partial char in {piece:?}"
                    );
                    got.push_str(&piece);
                }
            }
            got.push_str(&stream.finish().unwrap());
            assert_eq!(&got, want, "{what}: stream decode (skip={skip}) {t:?}");
        }
    }
}

fn check_chat(what: &str, tok: &Tokenizer, cases: &Cases) {
    let tmpl = tok
        .chat_template()
        .unwrap_or_else(|| panic!("{what}: no chat template ({:?})", tok.chat_template_error()));
    for c in &cases.chat_cases {
        let got = tmpl.render(&c.messages, c.add_generation_prompt).unwrap();
        assert_eq!(
            got, c.rendered,
            "{what}: render (gen prompt {})",
            c.add_generation_prompt
        );
        assert_eq!(
            tok.encode(&got, false).unwrap(),
            c.ids_of_rendered_add_special_tokens_false,
            "{what}: ids of render"
        );
    }
}

#[test]
fn fixture_tokenizers_match_transformers() {
    for dir in fixture_dirs() {
        let cases = load_cases(&dir);
        assert!(
            cases.encode_cases.len() >= 10 && !cases.chat_cases.is_empty(),
            "{}: too few cases",
            dir.display()
        );
        let all = tokenizers(&dir);
        let hf_eos = all[0].1.eos_ids().to_vec();
        for (name, tok) in all {
            let what = format!("{}/{name}", dir.file_name().unwrap().to_string_lossy());
            // Generation stops on the same ids whichever file the model was loaded from.
            assert_eq!(tok.eos_ids(), hf_eos, "{what}: eos ids");
            check_encode(&what, &tok, &cases);
            check_chat(&what, &tok, &cases);
        }
    }
}
