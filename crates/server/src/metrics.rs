//! Prometheus metrics, rendered by hand in the text exposition format (version 0.0.4).
//!
//! Two sources: the server's own counters and latency histograms (kept here, updated by the
//! handlers), and the engine's snapshot ([`mlaserve_engine::EngineHandle::metrics`]) read at
//! scrape time. Names follow vLLM's (`vllm:` → `mlaserve:`), so dashboards carry over. Every
//! sample carries `model_name`. Counters only grow; histogram buckets are cumulative on output.
//!
//! Hand-rolled rather than `metrics` + `metrics-exporter-prometheus` because that pair installs a
//! process-global recorder, which two apps in one test binary would share.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use mlaserve_engine::metrics::StepTimes;
use mlaserve_engine::{EngineMetrics, FinishReason};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0, 20.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0,
];

/// How an engine request ended, from the server's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Finished(FinishReason),
    /// The client went away (or a sibling choice failed) before the engine finished it.
    Dropped,
    /// The engine reported an error for it.
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Finished(r) => r.as_str(),
            Outcome::Dropped => "abort",
            Outcome::Error => "error",
        }
    }
}

/// A fixed-bucket histogram of seconds.
struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramData>,
}

#[derive(Default)]
struct HistogramData {
    /// [bounds.len() + 1] per-bucket (not cumulative) counts; the last is +Inf.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            inner: Mutex::new(HistogramData {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
            }),
        }
    }

    fn observe(&self, seconds: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        let mut data = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        data.counts[i] += 1;
        data.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let data = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in data.counts.iter().enumerate() {
            cumulative += count;
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", data.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// The server's own metrics; one per [`crate::AppState`].
pub(crate) struct ServerMetrics {
    /// (route, status code) → responses sent.
    http_responses: Mutex<BTreeMap<(String, u16), u64>>,
    /// Engine requests by outcome label.
    outcomes: Mutex<BTreeMap<&'static str, u64>>,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
}

impl ServerMetrics {
    pub(crate) fn new() -> Self {
        let mut outcomes = BTreeMap::new();
        for label in ["stop", "length", "abort", "error"] {
            outcomes.insert(label, 0);
        }
        Self {
            http_responses: Mutex::new(BTreeMap::new()),
            outcomes: Mutex::new(outcomes),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }

    pub(crate) fn record_http(&self, route: &str, status: u16) {
        let mut map = self
            .http_responses
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *map.entry((route.to_owned(), status)).or_insert(0) += 1;
    }

    pub(crate) fn record_first_token(&self, ttft: Duration) {
        self.ttft.observe(ttft.as_secs_f64());
    }

    /// One engine request ended. `tpot` is (last token − first token) / (tokens − 1), when defined.
    pub(crate) fn record_outcome(
        &self,
        outcome: Outcome,
        e2e: Duration,
        tpot: Option<Duration>,
        prompt_tokens: usize,
        generation_tokens: usize,
    ) {
        *self
            .outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(outcome.label())
            .or_insert(0) += 1;
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.generation_tokens
            .fetch_add(generation_tokens as u64, Ordering::Relaxed);
        self.e2e.observe(e2e.as_secs_f64());
        if let Some(tpot) = tpot {
            self.tpot.observe(tpot.as_secs_f64());
        }
    }

    /// The whole exposition text. `engine` is `None` while the model loads.
    pub(crate) fn render(&self, model_name: &str, engine: Option<&EngineMetrics>) -> String {
        let model = format!("model_name=\"{}\"", escape_label(model_name));
        let mut out = String::with_capacity(8 << 10);
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{model}}} {value}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{model}}} {value}"
            );
        };

        gauge(
            &mut out,
            "mlaserve:engine_ready",
            "1 once the model is loaded and the engine runs.",
            engine.map_or(0.0, |_| 1.0),
        );

        let name = "mlaserve:request_success_total";
        let _ = writeln!(
            out,
            "# HELP {name} Engine requests ended, by finish reason (abort: client gone)."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (reason, count) in self
            .outcomes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "{name}{{{model},finished_reason=\"{reason}\"}} {count}"
            );
        }

        let name = "mlaserve:http_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} HTTP responses, by route and status code."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for ((route, status), count) in self
            .http_responses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let route = escape_label(route);
            let _ = writeln!(
                out,
                "{name}{{{model},route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }

        counter(
            &mut out,
            "mlaserve:request_prompt_tokens_total",
            "Prompt tokens of ended requests (server side).",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mlaserve:request_generation_tokens_total",
            "Generated tokens of ended requests (server side).",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        self.ttft.render(
            &mut out,
            "mlaserve:time_to_first_token_seconds",
            "Time to first token.",
            &model,
        );
        self.tpot.render(
            &mut out,
            "mlaserve:time_per_output_token_seconds",
            "Time per output token after the first.",
            &model,
        );
        self.e2e.render(
            &mut out,
            "mlaserve:e2e_request_latency_seconds",
            "End-to-end request latency.",
            &model,
        );

        if let Some(m) = engine {
            render_engine(&mut out, &model, m, &counter, &gauge);
        }
        out
    }
}

fn render_engine(
    out: &mut String,
    model: &str,
    m: &EngineMetrics,
    counter: &dyn Fn(&mut String, &str, &str, u64),
    gauge: &dyn Fn(&mut String, &str, &str, f64),
) {
    gauge(
        out,
        "mlaserve:num_requests_running",
        "Requests in the running batch.",
        m.num_running as f64,
    );
    gauge(
        out,
        "mlaserve:num_requests_waiting",
        "Requests waiting to be scheduled.",
        m.num_waiting as f64,
    );
    gauge(
        out,
        "mlaserve:cache_blocks_used",
        "Latent-cache blocks held by requests.",
        m.num_cache_blocks_used as f64,
    );
    gauge(
        out,
        "mlaserve:cache_blocks_total",
        "Latent-cache blocks in the pool.",
        m.num_cache_blocks_total as f64,
    );
    let usage = if m.num_cache_blocks_total == 0 {
        0.0
    } else {
        m.num_cache_blocks_used as f64 / m.num_cache_blocks_total as f64
    };
    gauge(
        out,
        "mlaserve:kv_cache_usage_perc",
        "Latent-cache usage, 0 to 1 (1 = full).",
        usage,
    );
    counter(
        out,
        "mlaserve:prefix_cache_queries_total",
        "Prompt tokens looked up in the prefix cache.",
        m.prefix_cache_queries,
    );
    counter(
        out,
        "mlaserve:prefix_cache_hits_total",
        "Prompt tokens found in the prefix cache.",
        m.prefix_cache_hits,
    );
    counter(
        out,
        "mlaserve:num_preemptions_total",
        "Requests preempted for lack of cache blocks.",
        m.num_preemptions,
    );
    counter(
        out,
        "mlaserve:prompt_tokens_total",
        "Prompt tokens prefilled by the engine.",
        m.prompt_tokens_total,
    );
    counter(
        out,
        "mlaserve:generation_tokens_total",
        "Tokens generated by the engine.",
        m.generation_tokens_total,
    );
    let kinds = [("decode", &m.decode_steps), ("prefill", &m.prefill_steps)];
    type Field = fn(&StepTimes) -> String;
    let by_kind: [(&str, &str, Field); 4] = [
        (
            "mlaserve:engine_steps_total",
            "Engine steps, by kind (decode: every sequence computes one token past its prompt; prefill: a prompt chunk in the step).",
            |t| t.steps.to_string(),
        ),
        (
            "mlaserve:engine_step_tokens_total",
            "Tokens the engine's steps computed, by kind of step.",
            |t| t.tokens.to_string(),
        ),
        (
            "mlaserve:engine_step_forward_seconds_total",
            "Seconds in the model runner (forward pass, logits to the host), by kind of step.",
            |t| t.forward_seconds.to_string(),
        ),
        (
            "mlaserve:engine_step_host_seconds_total",
            "Seconds of the engine thread's own work around the forward pass (scheduling, sampling, output), by kind of step.",
            |t| t.host_seconds.to_string(),
        ),
    ];
    for (name, help, value) in by_kind {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (kind, t) in kinds {
            let _ = writeln!(out, "{name}{{{model},kind=\"{kind}\"}} {}", value(t));
        }
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample line is `name{labels} value` with a metric name, balanced quotes and a number.
    fn assert_exposition_format(text: &str) {
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("no value: {line}"));
            assert!(
                value == "+Inf" || value.parse::<f64>().is_ok(),
                "bad value in {line}"
            );
            let name_end = series.find('{').unwrap_or(series.len());
            let name = &series[..name_end];
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad name in {line}"
            );
            if name_end < series.len() {
                assert!(series.ends_with('}'), "unclosed labels in {line}");
                let unescaped = series.replace(r"\\", "").replace("\\\"", "");
                assert_eq!(
                    unescaped.matches('"').count() % 2,
                    0,
                    "unbalanced quotes in {line}"
                );
            }
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        for s in [0.05, 0.5, 0.7, 3.0] {
            h.observe(s);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help", "m=\"a\"");
        assert!(out.contains("x_bucket{m=\"a\",le=\"0.1\"} 1\n"));
        assert!(out.contains("x_bucket{m=\"a\",le=\"1\"} 3\n"));
        assert!(out.contains("x_bucket{m=\"a\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_count{m=\"a\"} 4\n"));
        assert!(out.contains("x_sum{m=\"a\"} 4.25\n"));
    }

    #[test]
    fn render_counts_outcomes_and_escapes_labels() {
        let m = ServerMetrics::new();
        m.record_first_token(Duration::from_millis(3));
        m.record_outcome(
            Outcome::Finished(FinishReason::Length),
            Duration::from_millis(40),
            Some(Duration::from_millis(2)),
            7,
            16,
        );
        m.record_outcome(Outcome::Dropped, Duration::from_millis(5), None, 3, 1);
        m.record_http("/v1/completions", 200);
        m.record_http("/v1/completions", 400);
        m.record_http("/v1/completions", 400);
        let text = m.render("we\"ird", None);
        assert_exposition_format(&text);
        let model = "model_name=\"we\\\"ird\"";
        assert!(text.contains(&format!(
            "mlaserve:request_success_total{{{model},finished_reason=\"length\"}} 1"
        )));
        assert!(text.contains(&format!(
            "mlaserve:request_success_total{{{model},finished_reason=\"abort\"}} 1"
        )));
        assert!(text.contains(&format!(
            "mlaserve:request_success_total{{{model},finished_reason=\"stop\"}} 0"
        )));
        assert!(text.contains(&format!(
            "mlaserve:http_requests_total{{{model},route=\"/v1/completions\",status=\"400\"}} 2"
        )));
        assert!(text.contains(&format!(
            "mlaserve:request_generation_tokens_total{{{model}}} 17"
        )));
        assert!(text.contains(&format!(
            "mlaserve:time_to_first_token_seconds_count{{{model}}} 1"
        )));
        assert!(text.contains(&format!("mlaserve:engine_ready{{{model}}} 0")));
        assert!(
            !text.contains("kv_cache_usage_perc"),
            "no engine section while loading"
        );
    }

    #[test]
    fn engine_step_times_render_by_kind() {
        let m = ServerMetrics::new();
        let engine = EngineMetrics {
            decode_steps: StepTimes {
                steps: 3,
                tokens: 192,
                forward_seconds: 0.036,
                host_seconds: 0.0015,
            },
            prefill_steps: StepTimes {
                steps: 1,
                tokens: 191,
                forward_seconds: 0.02,
                host_seconds: 0.25,
            },
            ..Default::default()
        };
        let text = m.render("m", Some(&engine));
        assert_exposition_format(&text);
        for line in [
            "mlaserve:engine_steps_total{model_name=\"m\",kind=\"decode\"} 3",
            "mlaserve:engine_step_tokens_total{model_name=\"m\",kind=\"prefill\"} 191",
            "mlaserve:engine_step_forward_seconds_total{model_name=\"m\",kind=\"decode\"} 0.036",
            "mlaserve:engine_step_host_seconds_total{model_name=\"m\",kind=\"prefill\"} 0.25",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
