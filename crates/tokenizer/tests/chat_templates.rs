//! Real chat templates (DeepSeek-V3.1, GLM-4.7-Flash, Qwen3) and one that exercises the Jinja
//! features templates rely on, rendered by [`ChatTemplate`] and compared byte for byte with
//! transformers' renderer (`chat_templates/make_cases.py` wrote `cases.json`).

use std::path::Path;

use mlaserve_tokenizer::{ChatMessage, ChatTemplate};
use serde::Deserialize;

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    template: String,
    conversation: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    messages: serde_json::Value,
    add_generation_prompt: bool,
    extra: serde_json::Map<String, serde_json::Value>,
    rendered: String,
}

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chat_templates")
}

#[test]
fn renders_match_transformers() {
    let cases: Cases =
        serde_json::from_str(&std::fs::read_to_string(dir().join("cases.json")).unwrap()).unwrap();
    assert!(cases.cases.len() >= 40);
    let mut failures = Vec::new();
    for c in &cases.cases {
        let source = std::fs::read_to_string(dir().join(&c.template)).unwrap();
        let tmpl = ChatTemplate::new(&source, c.bos_token.clone(), c.eos_token.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", c.template));
        let what = format!(
            "{} / {} / gen={} / {:?}",
            c.template, c.conversation, c.add_generation_prompt, c.extra
        );
        match tmpl.render_json(&c.messages, c.add_generation_prompt, &c.extra) {
            Ok(got) if got == c.rendered => {}
            Ok(got) => failures.push(format!(
                "{what}:\n--- got\n{got}\n--- want\n{}\n",
                c.rendered
            )),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} renders differ:\n{}",
        failures.len(),
        cases.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn raise_exception_fails_the_render_with_its_message() {
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
        "ok"
    );
    let e = t
        .render(&[ChatMessage::new("system", "x")], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("first message must be from the user"), "{e}");
}

#[test]
fn strftime_now_prints_the_current_date() {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    let got = t.render(&[], false).unwrap();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let year = 1970 + secs / 31_556_952; // mean Gregorian year; exact except within a day of New Year
    assert_eq!(got.len(), 10, "{got}");
    assert!(
        got.starts_with(&year.to_string())
            || got.starts_with(&(year - 1).to_string())
            || got.starts_with(&(year + 1).to_string()),
        "{got}"
    );
    let e = ChatTemplate::new("{{ strftime_now('%Q') }}", None, None)
        .unwrap()
        .render(&[], false)
        .unwrap_err();
    assert!(e.to_string().contains("%Q"), "{e}");
}

#[test]
fn syntax_errors_name_the_problem() {
    let e = ChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("chat template") && e.contains("syntax error"),
        "{e}"
    );
    let e = ChatTemplate::new("{{ messages | nosuchfilter }}", None, None)
        .and_then(|t| t.render(&[], false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nosuchfilter"), "{e}");
}
