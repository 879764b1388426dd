//! JSON text exactly as Python's `json.dumps(x, ensure_ascii=False, ...)` prints it, so chat
//! templates that embed tool schemas with `tojson` produce the same prompt bytes as transformers.
//!
//! Differences from `serde_json::to_string` that matter: `", "`/`": "` separators by default,
//! Python's indentation layout (`[]`/`{}` stay on one line when empty), optional key sorting.
//! Strings are escaped like Python: `"` `\` and control characters (`\n` `\r` `\t` `\b` `\f`,
//! others as `\u00XX`); non-ASCII characters are written as themselves.

use serde_json::Value;

/// Formatting options (`json.dumps` keyword arguments).
#[derive(Debug, Clone)]
pub struct Style {
    /// `indent`: `None` = one line; otherwise the string repeated per nesting level.
    pub indent: Option<String>,
    /// Separator between items (`", "`, or `","` when indenting).
    pub item_sep: String,
    /// Separator between a key and its value (`": "`).
    pub key_sep: String,
    /// `sort_keys`.
    pub sort_keys: bool,
}

impl Default for Style {
    fn default() -> Self {
        Style {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// Prints `v` in the given style.
pub fn dumps(v: &Value, style: &Style) -> String {
    let mut out = String::new();
    write_value(&mut out, v, style, 0);
    out
}

fn newline(out: &mut String, style: &Style, level: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_value(out: &mut String, v: &Value, style: &Style, level: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&python_number(n)),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, level + 1);
                write_value(out, item, style, level + 1);
            }
            newline(out, style, level);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, level + 1);
                write_str(out, k);
                out.push_str(&style.key_sep);
                write_value(out, val, style, level + 1);
            }
            newline(out, style, level);
            out.push('}');
        }
    }
}

/// Python prints floats with `repr`: `1.0`, `0.1`, `1e-07`, `1e+16`, `inf` is `Infinity`.
fn python_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let Some(f) = n.as_f64() else {
        return n.to_string();
    };
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's `{:?}` gives the shortest round-trip digits like Python's repr, but switches to
    // exponent form at different magnitudes; Python uses exponents when exp < -4 or >= 16.
    let exp = if f == 0.0 {
        0
    } else {
        f.abs().log10().floor() as i32
    };
    if (-4..16).contains(&exp) {
        let s = format!("{f:?}");
        if s.contains('e') {
            // Rust chose exponent form inside Python's positional range: expand it.
            let plain = format!("{f}");
            if plain.contains('.') {
                plain
            } else {
                format!("{plain}.0")
            }
        } else {
            s
        }
    } else {
        let s = format!("{f:e}"); // e.g. "1e16", "1.5e-7"
        let (mant, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        format!("{mant}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_style_matches_python() {
        // json.dumps({"a": [1, 2.5, None, True], "b": "x\"y\n€<>", "c": {}}, ensure_ascii=False)
        let v = json!({"a": [1, 2.5, null, true], "b": "x\"y\n€<>", "c": {}});
        assert_eq!(
            dumps(&v, &Style::default()),
            r#"{"a": [1, 2.5, null, true], "b": "x\"y\n€<>", "c": {}}"#
        );
    }

    #[test]
    fn indent_matches_python() {
        // json.dumps({"k": [1, {"z": []}]}, indent=2)
        let v = json!({"k": [1, {"z": []}]});
        let style = Style {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            ..Style::default()
        };
        assert_eq!(
            dumps(&v, &style),
            "{\n  \"k\": [\n    1,\n    {\n      \"z\": []\n    }\n  ]\n}"
        );
    }

    #[test]
    fn keys_keep_insertion_order_unless_sorted() {
        let v: Value = serde_json::from_str(r#"{"b": 1, "a": 2}"#).unwrap();
        assert_eq!(dumps(&v, &Style::default()), r#"{"b": 1, "a": 2}"#);
        let sorted = Style {
            sort_keys: true,
            ..Style::default()
        };
        assert_eq!(dumps(&v, &sorted), r#"{"a": 2, "b": 1}"#);
    }

    #[test]
    fn floats_print_like_python_repr() {
        for (f, py) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-7, "1e-07"),
            (1e16, "1e+16"),
            (123456.789, "123456.789"),
            (1.5e-5, "1.5e-05"),
        ] {
            assert_eq!(
                python_number(&serde_json::Number::from_f64(f).unwrap()),
                py,
                "{f}"
            );
        }
    }
}
