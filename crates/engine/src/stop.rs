//! Stop strings matched on detokenized text across token boundaries.
//!
//! Invariant: text already released never contains the beginning of a stop string that
//! might still complete. After each delta the matcher releases everything except the
//! longest suffix that is a proper prefix of some stop string; that suffix is withheld until
//! later text resolves it. On a match, text before the earliest occurrence is released and
//! the stop string itself is dropped (as OpenAI does). When generation ends for another
//! reason, [`StopStringMatcher::flush`] releases what was withheld.

/// What a text delta resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopMatch {
    /// No stop string yet; `release` is safe to emit (possibly empty).
    Continue { release: String },
    /// A stop string occurred; emit `release` and end generation.
    Stopped { release: String },
}

/// Incremental stop-string matcher for one request.
#[derive(Debug, Clone, Default)]
pub struct StopStringMatcher {
    stops: Vec<String>,
    /// Withheld text: a possible start of a stop string.
    pending: String,
}

impl StopStringMatcher {
    /// `stops` must not contain empty strings (requests are validated).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Feeds the next detokenized delta.
    pub fn push(&mut self, delta: &str) -> StopMatch {
        if self.stops.is_empty() {
            return StopMatch::Continue {
                release: delta.to_owned(),
            };
        }
        let mut text = std::mem::take(&mut self.pending);
        text.push_str(delta);
        let earliest = self
            .stops
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min();
        if let Some(pos) = earliest {
            text.truncate(pos);
            return StopMatch::Stopped { release: text };
        }
        let hold = self.longest_partial_suffix(&text);
        self.pending = text.split_off(text.len() - hold);
        StopMatch::Continue { release: text }
    }

    /// Releases the withheld text (generation ended for another reason).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Byte length of the longest suffix of `text` (on a char boundary) that is a proper
    /// prefix of some stop string.
    fn longest_partial_suffix(&self, text: &str) -> usize {
        let max_len = self
            .stops
            .iter()
            .map(|s| s.len() - 1)
            .max()
            .unwrap_or(0)
            .min(text.len());
        let start = text.len() - max_len;
        text.char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= start)
            .find(|&i| {
                self.stops
                    .iter()
                    .any(|s| s.len() > text.len() - i && s.starts_with(&text[i..]))
            })
            .map_or(0, |i| text.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `deltas`, returning the released text and whether a stop matched.
    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut m = StopStringMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for d in deltas {
            match m.push(d) {
                StopMatch::Continue { release } => out.push_str(&release),
                StopMatch::Stopped { release } => {
                    out.push_str(&release);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_tokens_is_cut_and_not_emitted() {
        assert_eq!(
            run(&["STOP"], &["hello S", "TO", "P world"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn withheld_prefix_is_released_when_it_does_not_complete() {
        let mut m = StopStringMatcher::new(vec!["abc".into()]);
        assert_eq!(
            m.push("xab"),
            StopMatch::Continue {
                release: "x".into()
            }
        );
        assert_eq!(
            m.push("d"),
            StopMatch::Continue {
                release: "abd".into()
            }
        );
        assert_eq!(
            m.push("a"),
            StopMatch::Continue {
                release: String::new()
            }
        );
        assert_eq!(m.flush(), "a");
        assert_eq!(run(&["abc"], &["ab", "ab", "c"]), ("ab".into(), true));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".into(), true)
        );
        assert_eq!(run(&["xyz", "b"], &["a", "bc"]), ("a".into(), true));
    }

    #[test]
    fn multibyte_text_is_split_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!x"]), ("caf".into(), true));
        assert_eq!(run(&["日本"], &["今日", "は"]), ("今日は".into(), false));
        assert_eq!(run(&["本語"], &["日", "本", "語"]), ("日".into(), true));
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn concatenation_of_releases_is_a_prefix_of_the_text() {
        // Every way of cutting the text into deltas gives the same result.
        let text = "one two STOP three";
        for cut1 in 0..=text.len() {
            for cut2 in cut1..=text.len() {
                let d = [&text[..cut1], &text[cut1..cut2], &text[cut2..]];
                assert_eq!(
                    run(&["STOP", "TOPS"], &d),
                    ("one two ".into(), true),
                    "cuts {cut1},{cut2}"
                );
            }
        }
    }
}
