//! Request validation: OpenAI fields → [`SamplingParams`], with vLLM's ranges and messages.
//!
//! Everything a client can get wrong is checked here, before the engine sees the request, and
//! answered with a 400 that names the parameter: `n` ≥ 1, `temperature` ≥ 0, `top_p` in (0, 1],
//! `top_k` −1/0 (off) or ≥ 1, `min_p` in [0, 1], penalties in [−2, 2], `repetition_penalty` > 0,
//! `max_tokens` ≥ 1, logprobs in 0..=max_logprobs, and prompt + max_tokens within the context.

use mlaserve_engine::SamplingParams;

use crate::config::ServerConfig;
use crate::error::{max_tokens_too_large_message, prompt_too_long_message, ApiError};
use crate::protocol::{parse_stop, SamplingFields};
use crate::state::AppState;

/// Sampling settings common to every choice of a request, plus the fan-out `n`.
#[derive(Debug, Clone)]
pub(crate) struct SamplingPlan {
    /// `max_tokens` is a placeholder until [`fit_max_tokens`] fixes it per prompt.
    pub params: SamplingParams,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
}

/// 404 unless `model` is absent or the served name.
pub(crate) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(name) if name != state.config().served_model_name => {
            Err(ApiError::model_not_found(name))
        }
        _ => Ok(()),
    }
}

/// Validate the shared sampling fields. `logprobs` is already checked by the caller.
pub(crate) fn sampling_plan(
    fields: &SamplingFields,
    logprobs: Option<usize>,
    config: &ServerConfig,
) -> Result<SamplingPlan, ApiError> {
    let n = fields.n.unwrap_or(1);
    if n < 1 {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be at least 1, got {n}."),
        ));
    }
    if n as u64 > config.max_n as u64 {
        return Err(ApiError::invalid_param(
            "n",
            format!("n must be at most {}, got {n}.", config.max_n),
        ));
    }
    if let Some(best_of) = fields.best_of.filter(|&b| b != n) {
        return Err(ApiError::invalid_param(
            "best_of",
            format!("best_of must equal n ({n}) or be absent, got {best_of}."),
        ));
    }
    if fields.min_tokens.is_some_and(|m| m != 0) {
        return Err(ApiError::invalid_param(
            "min_tokens",
            "min_tokens is not supported.",
        ));
    }
    let has_bias = match &fields.logit_bias {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Object(map)) => !map.is_empty(),
        Some(_) => true,
    };
    if has_bias {
        return Err(ApiError::invalid_param(
            "logit_bias",
            "logit_bias is not supported.",
        ));
    }

    let mut params = SamplingParams::default();
    if let Some(t) = fields.temperature {
        if !(t.is_finite() && t >= 0.0) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("temperature must be non-negative, got {t}."),
            ));
        }
        params.temperature = t as f32;
    }
    if let Some(p) = fields.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid_param(
                "top_p",
                format!("top_p must be in (0, 1], got {p}."),
            ));
        }
        params.top_p = p as f32;
    }
    params.top_k = match fields.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k >= 1 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
        Some(k) => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be -1 or 0 (disable), or at least 1, got {k}."),
            ))
        }
    };
    if let Some(m) = fields.min_p {
        if !(0.0..=1.0).contains(&m) {
            return Err(ApiError::invalid_param(
                "min_p",
                format!("min_p must be in [0, 1], got {m}."),
            ));
        }
        params.min_p = m as f32;
    }
    params.presence_penalty =
        penalty("presence_penalty", fields.presence_penalty)?.unwrap_or(params.presence_penalty);
    params.frequency_penalty =
        penalty("frequency_penalty", fields.frequency_penalty)?.unwrap_or(params.frequency_penalty);
    if let Some(r) = fields.repetition_penalty {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::invalid_param(
                "repetition_penalty",
                format!("repetition_penalty must be greater than zero, got {r}."),
            ));
        }
        params.repetition_penalty = r as f32;
    }
    // Negative seeds wrap to u64: any int64 is a valid seed, and the same one gives the same run.
    params.seed = fields.seed.map(|s| s as u64);
    params.stop = parse_stop(fields.stop.as_ref())?;
    params.stop_token_ids = fields.stop_token_ids.clone().unwrap_or_default();
    params.ignore_eos = fields.ignore_eos.unwrap_or(false);
    params.skip_special_tokens = fields.skip_special_tokens.unwrap_or(true);
    params.logprobs = logprobs;

    let stream = fields.stream.unwrap_or(false);
    if fields.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_param(
            "stream_options",
            "stream_options can only be set when stream is true.",
        ));
    }
    let include_usage = fields
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    Ok(SamplingPlan {
        params,
        n: n as usize,
        stream,
        include_usage,
    })
}

fn penalty(name: &str, value: Option<f64>) -> Result<Option<f32>, ApiError> {
    match value {
        Some(p) if !(-2.0..=2.0).contains(&p) => Err(ApiError::invalid_param(
            name,
            format!("{name} must be in [-2, 2], got {p}."),
        )),
        other => Ok(other.map(|p| p as f32)),
    }
}

/// `logprobs` (completions) or `top_logprobs` (chat): 0..=max.
pub(crate) fn check_logprobs(
    name: &str,
    value: Option<i64>,
    max: usize,
) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v < 0 || v as u64 > max as u64 => Err(ApiError::invalid_param(
            name,
            format!("{name} must be between 0 and {max}, got {v}."),
        )),
        Some(v) => Ok(Some(v as usize)),
    }
}

/// `max_tokens` / `max_completion_tokens` ≥ 1 when given.
pub(crate) fn check_max_tokens(name: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v < 1 => Err(ApiError::invalid_param(
            name,
            format!("{name} must be at least 1, got {v}."),
        )),
        Some(v) => Ok(Some(usize::try_from(v).unwrap_or(usize::MAX))),
    }
}

/// What `max_tokens` means when the client leaves it out.
#[derive(Debug, Clone, Copy)]
pub(crate) enum MaxTokensDefault {
    /// OpenAI completions: 16, capped by the room left.
    Fixed(usize),
    /// Chat: all the room left in the context window (vLLM).
    RestOfContext,
}

/// The `max_tokens` for one prompt: 400 with vLLM's wording when prompt + max_tokens does not fit.
/// `prompt_param` names the field that holds the prompt (`prompt` or `messages`).
pub(crate) fn fit_max_tokens(
    requested: Option<usize>,
    default: MaxTokensDefault,
    prompt_tokens: usize,
    max_model_len: usize,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    if prompt_tokens >= max_model_len {
        return Err(ApiError::context_length(
            prompt_param,
            prompt_too_long_message(prompt_tokens, max_model_len),
        ));
    }
    let room = max_model_len - prompt_tokens;
    match (requested, default) {
        (Some(m), _) if m > room => Err(ApiError::context_length(
            "max_tokens",
            max_tokens_too_large_message(m, max_model_len, prompt_tokens),
        )),
        (Some(m), _) => Ok(m),
        (None, MaxTokensDefault::Fixed(d)) => Ok(d.min(room)),
        (None, MaxTokensDefault::RestOfContext) => Ok(room),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(v: serde_json::Value) -> Result<SamplingPlan, ApiError> {
        let fields: SamplingFields = serde_json::from_value(v).unwrap();
        sampling_plan(&fields, None, &ServerConfig::default())
    }

    #[test]
    fn defaults_are_openai_defaults() {
        let p = plan(json!({})).unwrap();
        assert_eq!((p.n, p.stream, p.include_usage), (1, false, false));
        assert_eq!(p.params.temperature, 1.0);
        assert_eq!(p.params.top_p, 1.0);
        assert_eq!(p.params.top_k, None);
        assert!(p.params.skip_special_tokens);
    }

    #[test]
    fn fields_reach_sampling_params() {
        let p = plan(
            json!({"n": 3, "temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1,
            "presence_penalty": 1.5, "frequency_penalty": -1, "repetition_penalty": 1.2, "seed": -1,
            "stop": ["a", "b"], "stop_token_ids": [5], "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true}, "skip_special_tokens": false}),
        )
        .unwrap();
        assert_eq!((p.n, p.stream, p.include_usage), (3, true, true));
        let s = &p.params;
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p),
            (0.0, 0.5, Some(7), 0.1)
        );
        assert_eq!(
            (
                s.presence_penalty,
                s.frequency_penalty,
                s.repetition_penalty
            ),
            (1.5, -1.0, 1.2)
        );
        assert_eq!(s.seed, Some(u64::MAX));
        assert_eq!(s.stop, vec!["a", "b"]);
        assert_eq!(s.stop_token_ids, vec![5]);
        assert!(s.ignore_eos && !s.skip_special_tokens);
        assert_eq!(plan(json!({"top_k": -1})).unwrap().params.top_k, None);
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        let cases = [
            (json!({"n": 0}), "n"),
            (json!({"n": 100000}), "n"),
            (json!({"temperature": -0.1}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"top_p": 1.5}), "top_p"),
            (json!({"top_k": -2}), "top_k"),
            (json!({"min_p": 1.1}), "min_p"),
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"frequency_penalty": -3}), "frequency_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"stop": 5}), "stop"),
            (json!({"best_of": 2}), "best_of"),
            (json!({"min_tokens": 3}), "min_tokens"),
            (json!({"logit_bias": {"5": 10}}), "logit_bias"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
        ];
        for (body, param) in cases {
            let err = plan(body.clone()).unwrap_err();
            assert_eq!(err.status.as_u16(), 400, "{body}");
            assert_eq!(err.param.as_deref(), Some(param), "{body}");
        }
        assert!(check_logprobs("logprobs", Some(21), 20).is_err());
        assert!(check_logprobs("logprobs", Some(-1), 20).is_err());
        assert_eq!(check_logprobs("logprobs", Some(20), 20).unwrap(), Some(20));
        assert!(check_max_tokens("max_tokens", Some(0)).is_err());
        assert_eq!(check_max_tokens("max_tokens", Some(5)).unwrap(), Some(5));
    }

    #[test]
    fn max_tokens_fits_the_context() {
        use MaxTokensDefault::*;
        assert_eq!(
            fit_max_tokens(None, Fixed(16), 10, 256, "prompt").unwrap(),
            16
        );
        assert_eq!(
            fit_max_tokens(None, Fixed(16), 250, 256, "prompt").unwrap(),
            6
        );
        assert_eq!(
            fit_max_tokens(None, RestOfContext, 10, 256, "messages").unwrap(),
            246
        );
        assert_eq!(
            fit_max_tokens(Some(246), RestOfContext, 10, 256, "messages").unwrap(),
            246
        );
        let err = fit_max_tokens(Some(247), RestOfContext, 10, 256, "messages").unwrap_err();
        assert_eq!(err.code, Some("context_length_exceeded"));
        assert!(err.message.contains("(247 > 256 - 10)"));
        let err = fit_max_tokens(None, Fixed(16), 256, 256, "prompt").unwrap_err();
        assert!(err.message.contains("your request has 256 input tokens"));
        assert_eq!(err.param.as_deref(), Some("prompt"));
    }
}
