//! `SamplingParams`: how one request turns logits into tokens and when it stops.
//!
//! Defaults follow the OpenAI API (and vLLM's server): `temperature = 1.0`, `top_p = 1.0`,
//! no top-k, no min-p, no penalties — i.e. plain sampling from the model's distribution,
//! NOT greedy. Set `temperature = 0.0` for greedy decoding. `max_tokens` defaults to 16 as
//! in OpenAI's legacy completions API; servers normally set it explicitly.

use crate::rng::Rng;
use mlaserve_model::{Filter, RowDraw};

/// Largest `logprobs` (top-N alternatives per token) a request may ask for, as vLLM's
/// default `max_logprobs`.
pub const MAX_LOGPROBS: usize = 20;

/// Temperatures below this are treated as greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_EPSILON: f32 = 1e-5;

/// Per-request sampling and stopping parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Maximum number of generated tokens (>= 1).
    pub max_tokens: usize,
    /// Softmax temperature; 0 (or below [`GREEDY_EPSILON`]) means greedy argmax.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`, in (0, 1].
    pub top_p: f32,
    /// Keep only the `k` most probable tokens (`None` = all).
    pub top_k: Option<usize>,
    /// Drop tokens whose probability is below `min_p` times the top probability, in [0, 1].
    pub min_p: f32,
    /// HF-style repetition penalty over prompt and output tokens (> 0; 1 = off).
    pub repetition_penalty: f32,
    /// OpenAI presence penalty over output tokens, in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI frequency penalty over output tokens, in [-2, 2].
    pub frequency_penalty: f32,
    /// Seed of this request's own random stream (`None`: the engine picks one).
    pub seed: Option<u64>,
    /// Stop strings; the matched string is not part of the output text.
    pub stop: Vec<String>,
    /// Token ids that end generation (in addition to EOS).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the tokenizer's end-of-generation ids.
    pub ignore_eos: bool,
    /// Return the sampled token's log-probability plus this many top alternatives
    /// (log_softmax of the raw logits, before penalties and temperature).
    pub logprobs: Option<usize>,
    /// Leave special tokens out of the detokenized text.
    pub skip_special_tokens: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_EPSILON
    }

    /// Whether a device can pick this row's token from the row alone
    /// ([`mlaserve_model::RowPick`]): greedy or sampling (with any temperature, top-k, top-p
    /// and min-p), no penalty, no logprobs.
    pub fn draws_on_device(&self) -> bool {
        self.logprobs.is_none() && !self.is_penalized()
    }

    /// The device's draw for the next token ([`SamplingParams::draws_on_device`] rows): the
    /// argmax, or a softmax draw by the next 64 bits of `rng` — which the host sampler would
    /// have taken for the same token (greedy takes none).
    pub fn row_draw(&self, rng: &mut Rng) -> RowDraw {
        if self.is_greedy() {
            RowDraw::Argmax
        } else {
            RowDraw::Softmax {
                inv_temperature: self.inv_temperature(),
                random: rng.next_u64(),
                filter: self.filter(),
            }
        }
    }

    /// The top-k, top-p and min-p as a draw's [`Filter`].
    pub fn filter(&self) -> Filter {
        Filter {
            top_k: self.top_k.map_or(0, |k| k.min(u32::MAX as usize) as u32),
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// `1 / temperature` as the sampler divides by it (temperatures below
    /// [`GREEDY_EPSILON`] count as it).
    pub fn inv_temperature(&self) -> f32 {
        1.0 / self.temperature.max(GREEDY_EPSILON)
    }

    /// Whether any repetition, presence or frequency penalty applies.
    pub fn is_penalized(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Checks every field's range; the message names the offending field.
    pub fn validate(&self, vocab_size: usize) -> Result<(), String> {
        if self.max_tokens == 0 {
            return Err("max_tokens must be at least 1".into());
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.top_k == Some(0) {
            return Err("top_k must be at least 1 (or unset for no limit)".into());
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(format!(
                "repetition_penalty must be a finite number > 0, got {}",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if let Some(n) = self.logprobs {
            if n > MAX_LOGPROBS {
                return Err(format!("logprobs must be at most {MAX_LOGPROBS}, got {n}"));
            }
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return Err("stop strings must not be empty".into());
        }
        if let Some(&id) = self
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(format!(
                "stop_token_ids contains {id}, outside the vocabulary of {vocab_size}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_openai_sampling_not_greedy() {
        let p = SamplingParams::default();
        assert_eq!(p.temperature, 1.0);
        assert!(!p.is_greedy());
        assert!(SamplingParams::greedy(4).is_greedy());
        assert!(p.validate(10).is_ok());
    }

    #[test]
    fn validate_names_the_bad_field() {
        let bad = [
            (
                SamplingParams {
                    max_tokens: 0,
                    ..Default::default()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_k: Some(0),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 3.0,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -2.5,
                    ..Default::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..Default::default()
                },
                "logprobs",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..Default::default()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![10],
                    ..Default::default()
                },
                "stop_token_ids",
            ),
        ];
        for (p, field) in bad {
            let e = p.validate(10).unwrap_err();
            assert!(e.contains(field), "{e} should name {field}");
        }
    }
}
