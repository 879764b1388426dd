//! Unit tests over a small byte-level BPE vocabulary built in code: the 256 byte symbols, a few
//! merges, control / user-defined / unused / byte tokens — every branch of `GgufVocab::build`.

use std::sync::Arc;

use crate::gguf_vocab::GgufVocab;
use crate::{ChatMessage, DecodeStream, Tokenizer, TokenizerError};

/// GPT-2's byte → printable char map (HF `bytes_to_unicode`).
pub(crate) fn byte_char(b: u8) -> char {
    let printable =
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return char::from(b);
    }
    // Non-printable bytes get 256, 257, ... in byte order.
    let mut n = 0u32;
    for x in 0..b {
        let p =
            (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x);
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap()
}

fn bl(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

/// ids 0..256: bytes; then merges' results; then special tokens.
pub(crate) fn small_vocab() -> GgufVocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let merges = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        (" ", "t"),
        (" t", "he"),
        (" ", "w"),
    ];
    let mut merge_strs = Vec::new();
    for (a, b) in merges {
        merge_strs.push(format!("{} {}", bl(a), bl(b)));
        tokens.push(bl(&format!("{a}{b}")));
    }
    let mut types = vec![1i64; tokens.len()];
    for (text, ty) in [
        ("<|begin|>", 3),
        ("<|end|>", 3),
        ("<think>", 4),
        ("[PAD999]", 5),
        ("<0x41>", 6),
        ("<|user|>", 3),
    ] {
        tokens.push(text.to_string());
        types.push(ty);
    }
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u64;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        bos: Some(id("<|begin|>")),
        eos: Some(id("<|end|>")),
        eot: Some(id("<|user|>")),
        add_bos: Some(true),
        chat_template: Some("{% for m in messages %}<|user|>{{ m.content }}{% endfor %}".into()),
        token_types: Some(types),
        merges: Some(merge_strs),
        tokens,
        ..GgufVocab::default()
    }
}

fn tok() -> Tokenizer {
    small_vocab().build().unwrap()
}

#[test]
fn encodes_with_merges_and_special_tokens() {
    let t = tok();
    let hello = t.token_to_id(&bl("hello")).unwrap();
    let the = t.token_to_id(&bl(" the")).unwrap();
    let begin = t.token_to_id("<|begin|>").unwrap();
    let end = t.token_to_id("<|end|>").unwrap();
    let think = t.token_to_id("<think>").unwrap();
    assert_eq!(t.encode("hello the", false).unwrap(), [hello, the]);
    assert_eq!(t.encode("hello the", true).unwrap(), [begin, hello, the]);
    assert_eq!(
        t.encode("<think>hello<|end|>", false).unwrap(),
        [think, hello, end]
    );
    assert_eq!(t.bos_id(), Some(begin));
    let user = t.token_to_id("<|user|>").unwrap();
    assert_eq!(t.eos_ids(), {
        let mut v = vec![end, user];
        v.sort();
        v
    });
    assert!(t.is_special(end) && !t.is_special(think));
}

#[test]
fn decode_round_trips_and_skips_only_special() {
    let t = tok();
    for text in [
        "hello the world",
        "  spaces\n\ttabs",
        "ünïcödé 你好 🦀🚀",
        "<think>x</think>",
    ] {
        let ids = t.encode(text, false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), text);
    }
    let ids = t.encode("<|begin|><think>hi<|end|>", false).unwrap();
    assert_eq!(t.decode(&ids, true).unwrap(), "<think>hi");
    assert_eq!(t.decode(&ids, false).unwrap(), "<|begin|><think>hi<|end|>");
}

#[test]
fn decode_rejects_out_of_range_ids() {
    let t = tok();
    let n = t.vocab_size() as u32;
    assert!(
        matches!(t.decode(&[0, n], false), Err(TokenizerError::TokenOutOfRange { id, .. }) if id == n)
    );
}

#[test]
fn decode_stream_matches_full_decode_and_never_splits_chars() {
    let t = Arc::new(tok());
    // Only single bytes exist for non-ASCII text, so every multi-byte char spans several ids.
    let text = "hello 🦀 the 你好 wörld <|end|> 😶‍🌫️!";
    for skip in [false, true] {
        let ids = t.encode(text, false).unwrap();
        let mut s = DecodeStream::new(t.clone(), skip);
        let mut out = String::new();
        for &id in &ids {
            if let Some(piece) = s.step(id).unwrap() {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "partial char emitted: {piece:?}"
                );
                out.push_str(&piece);
            }
        }
        out.push_str(&s.finish().unwrap());
        assert_eq!(out, t.decode(&ids, skip).unwrap());
    }
}

#[test]
fn decode_stream_flushes_an_incomplete_tail_on_finish() {
    let t = Arc::new(tok());
    let crab = t.encode("🦀", false).unwrap();
    assert_eq!(crab.len(), 4);
    let mut s = DecodeStream::new(t.clone(), false);
    for &id in &crab[..3] {
        assert_eq!(s.step(id).unwrap(), None);
    }
    assert_eq!(s.finish().unwrap(), t.decode(&crab[..3], false).unwrap());
    assert!(s.step(u32::MAX).is_err());
}

#[test]
fn chat_template_comes_with_bos_and_eos_text() {
    let t = tok();
    let tmpl = t.chat_template().unwrap();
    let out = tmpl
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(out, "<|user|>hi");
}

fn build_err(f: impl FnOnce(&mut GgufVocab)) -> String {
    let mut v = small_vocab();
    f(&mut v);
    v.build().unwrap_err().to_string()
}

#[test]
fn malformed_vocabularies_are_errors_naming_the_key() {
    let e = build_err(|v| v.merges.as_mut().unwrap()[0] = "hello".into());
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("entry 0"),
        "{e}"
    );
    let e = build_err(|v| v.merges.as_mut().unwrap()[1] = "l ".into());
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("empty right part"),
        "{e}"
    );
    let e = build_err(|v| v.merges.as_mut().unwrap().push("zz qq".into()));
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    let e = build_err(|v| v.merges = None);
    assert!(
        e.contains("tokenizer.ggml.merges") && e.contains("missing"),
        "{e}"
    );
    let e = build_err(|v| v.bos = Some(1 << 40));
    assert!(
        e.contains("tokenizer.ggml.bos_token_id") && e.contains("out of range"),
        "{e}"
    );
    let e = build_err(|v| v.eom = Some(100_000));
    assert!(e.contains("tokenizer.ggml.eom_token_id"), "{e}");
    let e = build_err(|v| v.pad = Some(100_000));
    assert!(e.contains("tokenizer.ggml.padding_token_id"), "{e}");
    for bad in ["<0x-1>", "<0xZZ>", "<0x1>", "<0x123>", "0x41"] {
        let e = build_err(|v| {
            let i = v.tokens.iter().position(|t| t == "<0x41>").unwrap();
            v.tokens[i] = bad.into();
        });
        assert!(
            e.contains("tokenizer.ggml.tokens") && e.contains(bad),
            "{e}"
        );
    }
    let e = build_err(|v| v.token_types.as_mut().unwrap().truncate(10));
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("has 10 entries"),
        "{e}"
    );
    let e = build_err(|v| v.token_types.as_mut().unwrap()[7] = 9);
    assert!(
        e.contains("tokenizer.ggml.token_type") && e.contains("entry 7 is 9"),
        "{e}"
    );
    let e = build_err(|v| v.tokens[260] = v.tokens[5].clone());
    assert!(e.contains("appears twice"), "{e}");
    let e = build_err(|v| v.tokens.clear());
    assert!(
        e.contains("tokenizer.ggml.tokens") && e.contains("empty"),
        "{e}"
    );
    let e = build_err(|v| v.arch_vocab_size = Some(("deepseek2.vocab_size".into(), 1 << 20)));
    assert!(
        e.contains("deepseek2.vocab_size") && e.contains("larger"),
        "{e}"
    );
    let e = build_err(|v| v.model = "llama".into());
    assert!(e.contains("unsupported tokenizer model `llama`"), "{e}");
    let e = build_err(|v| v.pre = Some("mystery".into()));
    assert!(e.contains("mystery") && e.contains("deepseek-v3"), "{e}");
}

#[test]
fn missing_pre_falls_back_to_gpt2() {
    let mut v = small_vocab();
    v.pre = None;
    let t = v.build().unwrap();
    assert_eq!(
        t.encode("hello the", false).unwrap(),
        tok().encode("hello the", false).unwrap()
    );
}

#[test]
fn broken_template_disables_chat_with_a_reason() {
    let mut v = small_vocab();
    v.chat_template = Some("{% for m in messages %}".into());
    let t = v.build().unwrap();
    assert!(t.chat_template().is_none());
    assert!(
        t.chat_template_error().unwrap().contains("chat template"),
        "{:?}",
        t.chat_template_error()
    );
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<DecodeStream>();
    check::<crate::ChatTemplate>();
}
