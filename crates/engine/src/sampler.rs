//! Token sampling for one sequence from one row of logits.
//!
//! Order (as vLLM v1):
//! 1. log-probabilities, if asked, from the RAW logits (log_softmax before any penalty or
//!    temperature — vLLM's default `raw_logprobs` mode);
//! 2. repetition penalty (HF / CTRL style) over every token seen in prompt and output:
//!    positive logits are divided by it, negative ones multiplied;
//! 3. OpenAI presence and frequency penalties over the output tokens:
//!    `logit -= presence * [count > 0] + frequency * count`;
//! 4. temperature 0 (below [`GREEDY_EPSILON`](crate::sampling_params::GREEDY_EPSILON)):
//!    argmax, ties to the lowest id — no randomness consumed;
//! 5. otherwise: divide by temperature, softmax, min-p (drop p < min_p * p_max), top-k,
//!    top-p over what remains (renormalized), then draw one uniform number from the
//!    sequence's own RNG and invert the CDF over the kept tokens in id order.
//!
//! Ties in top-k / top-p rank lower ids first, so the result is a function of the logits,
//! the history, the parameters and the RNG state only (never of the batch).

use std::collections::HashMap;

use crate::request::TokenLogprob;
use crate::rng::Rng;
use crate::sampling_params::SamplingParams;

/// A row of logits the sampler cannot use.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("logits row has {got} entries, the vocabulary has {expected}")]
    WrongLength { got: usize, expected: usize },
    #[error("model produced a non-finite logit ({value}) at token {index}")]
    NonFinite { index: usize, value: f32 },
    #[error("every logit is -inf: no token can be sampled")]
    AllMasked,
}

/// The sampled token and, if asked, its log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token_id: u32,
    pub logprob: Option<TokenLogprob>,
}

/// Samples one token. `logits` is the model's row `[vocab_size]`; `prompt`/`output` are the
/// sequence's tokens so far (for penalties).
pub fn sample(
    logits: &[f32],
    vocab_size: usize,
    params: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
    rng: &mut Rng,
) -> Result<Sampled, SamplerError> {
    if logits.len() != vocab_size {
        return Err(SamplerError::WrongLength {
            got: logits.len(),
            expected: vocab_size,
        });
    }
    if let Some((index, &value)) = logits
        .iter()
        .enumerate()
        .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
    {
        return Err(SamplerError::NonFinite { index, value });
    }
    if logits.iter().all(|&v| v == f32::NEG_INFINITY) {
        return Err(SamplerError::AllMasked);
    }

    let mut work = logits.to_vec();
    apply_penalties(&mut work, params, prompt, output);
    let token_id = if params.is_greedy() {
        argmax(&work)
    } else {
        sample_filtered(&mut work, params, rng)
    };
    let logprob = params.logprobs.map(|n| token_logprob(logits, token_id, n));
    Ok(Sampled { token_id, logprob })
}

/// Repetition, presence and frequency penalties, in place.
pub fn apply_penalties(
    logits: &mut [f32],
    params: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
) {
    let vocab = logits.len();
    if params.repetition_penalty != 1.0 {
        let mut seen: Vec<u32> = prompt
            .iter()
            .chain(output)
            .copied()
            .filter(|&t| (t as usize) < vocab)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        let r = params.repetition_penalty;
        for t in seen {
            let l = &mut logits[t as usize];
            *l = if *l > 0.0 { *l / r } else { *l * r };
        }
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output.iter().filter(|&&t| (t as usize) < vocab) {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            logits[t as usize] -= params.presence_penalty + params.frequency_penalty * c as f32;
        }
    }
}

/// Index of the largest value, the lowest index among equals. `-inf` only loses to finite.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// Temperature, softmax, min-p, top-k, top-p, then one draw. `logits` is consumed as scratch.
fn sample_filtered(logits: &mut [f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    let probs = filtered_probs(logits, params);
    let total: f64 = probs.iter().map(|&(_, p)| p as f64).sum();
    let mut target = rng.next_f64() * total;
    let mut last = probs[0].0;
    for &(id, p) in &probs {
        last = id;
        target -= p as f64;
        if target < 0.0 {
            return id;
        }
    }
    last // rounding left a sliver past the end: the last kept token
}

/// The kept `(token, unnormalized probability)` pairs in id order, never empty when at
/// least one logit is finite.
pub fn filtered_probs(logits: &mut [f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    let inv_t = 1.0
        / params
            .temperature
            .max(crate::sampling_params::GREEDY_EPSILON);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // [vocab] unnormalized probabilities exp((l - max) / T); the max token has 1.0.
    for l in logits.iter_mut() {
        *l = ((*l - max) * inv_t).exp();
    }
    let min_keep = if params.min_p > 0.0 {
        params.min_p
    } else {
        0.0
    };
    let mut kept: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, &p)| p > 0.0 && p >= min_keep)
        .map(|(i, &p)| (i as u32, p))
        .collect();
    // Rank: higher probability first, lower id first among equals.
    let rank = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if let Some(k) = params.top_k {
        if k < kept.len() {
            kept.select_nth_unstable_by(k - 1, rank);
            kept.truncate(k);
        }
    }
    if params.top_p < 1.0 {
        kept.sort_unstable_by(rank);
        let total: f64 = kept.iter().map(|&(_, p)| p as f64).sum();
        let mut cum = 0.0;
        let mut n = 0;
        for &(_, p) in &kept {
            cum += p as f64;
            n += 1;
            if cum >= params.top_p as f64 * total {
                break;
            }
        }
        kept.truncate(n.max(1));
    }
    kept.sort_unstable_by_key(|&(id, _)| id);
    kept
}

/// `log_softmax(raw)` at `token_id` and the `n` most likely tokens (lower id first on ties).
pub fn token_logprob(raw: &[f32], token_id: u32, n: usize) -> TokenLogprob {
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = raw.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |id: u32| (raw[id as usize] as f64 - log_z) as f32;
    let mut top: Vec<u32> = (0..raw.len() as u32).collect();
    let rank = |a: &u32, b: &u32| raw[*b as usize].total_cmp(&raw[*a as usize]).then(a.cmp(b));
    let n = n.min(raw.len());
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, rank);
    }
    top.truncate(n);
    top.sort_unstable_by(rank);
    TokenLogprob {
        token_id,
        logprob: lp(token_id),
        top: top.into_iter().map(|id| (id, lp(id))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        f(&mut p);
        p
    }

    fn kept_ids(logits: &[f32], p: &SamplingParams) -> Vec<u32> {
        filtered_probs(&mut logits.to_vec(), p)
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    #[test]
    fn greedy_takes_argmax_lowest_id_on_ties_and_uses_no_randomness() {
        let logits = [0.5, 2.0, -1.0, 2.0];
        let p = SamplingParams::greedy(1);
        let mut rng = Rng::seed_from_u64(1);
        let before = rng.clone().next_u64();
        let s = sample(&logits, 4, &p, &[], &[], &mut rng).unwrap();
        assert_eq!(s.token_id, 1);
        assert_eq!(rng.next_u64(), before, "greedy must not consume the RNG");
        assert_eq!(argmax(&[f32::NEG_INFINITY, -3.0]), 1);
    }

    #[test]
    fn top_k_keeps_the_k_best_ties_to_lower_ids() {
        let logits = [1.0, 3.0, 2.0, 3.0, 0.0];
        assert_eq!(
            kept_ids(&logits, &params(|p| p.top_k = Some(2))),
            vec![1, 3]
        );
        assert_eq!(
            kept_ids(&logits, &params(|p| p.top_k = Some(3))),
            vec![1, 2, 3]
        );
        let ties = [1.0, 1.0, 1.0];
        assert_eq!(kept_ids(&ties, &params(|p| p.top_k = Some(1))), vec![0]);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        // probs ∝ exp: [e^2, e^1, e^0, e^-5] ≈ [0.665, 0.245, 0.090, 0.0004]
        let logits = [2.0, 1.0, 0.0, -5.0];
        assert_eq!(kept_ids(&logits, &params(|p| p.top_p = 0.5)), vec![0]);
        assert_eq!(kept_ids(&logits, &params(|p| p.top_p = 0.7)), vec![0, 1]);
        assert_eq!(
            kept_ids(&logits, &params(|p| p.top_p = 0.95)),
            vec![0, 1, 2]
        );
        assert_eq!(kept_ids(&logits, &params(|p| p.top_p = 1.0)).len(), 4);
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_max() {
        let logits = [0.0, (0.5f32).ln(), (0.05f32).ln(), (0.2f32).ln()];
        assert_eq!(kept_ids(&logits, &params(|p| p.min_p = 0.1)), vec![0, 1, 3]);
        assert_eq!(kept_ids(&logits, &params(|p| p.min_p = 0.3)), vec![0, 1]);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [1.0, 0.0];
        let hot = filtered_probs(&mut logits.to_vec(), &params(|p| p.temperature = 10.0));
        let cold = filtered_probs(&mut logits.to_vec(), &params(|p| p.temperature = 0.1));
        assert!(hot[1].1 > 0.9, "{hot:?}");
        assert!(cold[1].1 < 1e-4, "{cold:?}");
    }

    #[test]
    fn penalties_follow_hf_and_openai_formulas() {
        let mut l = vec![2.0, -2.0, 1.0, 1.0];
        let p = params(|p| {
            p.repetition_penalty = 2.0;
            p.presence_penalty = 0.5;
            p.frequency_penalty = 0.25;
        });
        // token 0 in the prompt, token 1 twice and token 2 once in the output.
        apply_penalties(&mut l, &p, &[0, 0], &[1, 2, 1]);
        assert_eq!(l[0], 1.0); // 2 / 2
        assert_eq!(l[1], -4.0 - 0.5 - 0.5); // -2 * 2 - presence - 2 * frequency
        assert_eq!(l[2], 0.5 - 0.5 - 0.25); // 1 / 2 - presence - frequency
        assert_eq!(l[3], 1.0); // unseen
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let logits: Vec<f32> = vec![0.0, 1.0, 2.0, -1.0];
        let p = params(|_| {});
        let draw = |seed| {
            let mut rng = Rng::seed_from_u64(seed);
            (0..64)
                .map(|_| sample(&logits, 4, &p, &[], &[], &mut rng).unwrap().token_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
        let mut rng = Rng::seed_from_u64(9);
        let mut counts = [0usize; 4];
        let n = 20_000;
        for _ in 0..n {
            counts[sample(&logits, 4, &p, &[], &[], &mut rng).unwrap().token_id as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let expect = (logits[i] as f64).exp() / z;
            assert!(
                (c as f64 / n as f64 - expect).abs() < 0.015,
                "token {i}: {c}/{n} vs {expect}"
            );
        }
    }

    #[test]
    fn logprobs_are_raw_log_softmax_with_sorted_top_n() {
        let logits = [1.0, 3.0, 2.0, 3.0];
        let p = SamplingParams {
            logprobs: Some(3),
            repetition_penalty: 5.0,
            ..SamplingParams::greedy(1)
        };
        let s = sample(&logits, 4, &p, &[1], &[], &mut Rng::seed_from_u64(0)).unwrap();
        // The penalty moved the argmax to token 3, but logprobs stay raw.
        assert_eq!(s.token_id, 3);
        let lp = s.logprob.unwrap();
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((lp.logprob as f64 - (3.0 - z.ln())).abs() < 1e-5);
        let ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((lp.top[0].1 - lp.logprob).abs() < 1e-6);
        let total: f64 = logits.iter().map(|&l| ((l as f64) - z.ln()).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }

    #[test]
    fn bad_rows_are_errors_not_panics() {
        let p = SamplingParams::greedy(1);
        let mut rng = Rng::seed_from_u64(0);
        assert_eq!(
            sample(&[0.0; 3], 4, &p, &[], &[], &mut rng),
            Err(SamplerError::WrongLength {
                got: 3,
                expected: 4
            })
        );
        assert!(matches!(
            sample(&[0.0, f32::NAN], 2, &p, &[], &[], &mut rng),
            Err(SamplerError::NonFinite { index: 1, .. })
        ));
        assert_eq!(
            sample(&[f32::NEG_INFINITY; 2], 2, &p, &[], &[], &mut rng),
            Err(SamplerError::AllMasked)
        );
        // -inf entries are masked, never sampled.
        let s = sample(
            &[f32::NEG_INFINITY, 0.0],
            2,
            &params(|_| {}),
            &[],
            &[],
            &mut rng,
        )
        .unwrap();
        assert_eq!(s.token_id, 1);
    }
}
