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
//!    top-p over what remains (renormalized), then draw 64 random bits from the sequence's
//!    own RNG and invert the CDF over the kept tokens in id order — in fixed-point weights
//!    ([`mlaserve_model::draw`]), so that a row drawn on a GPU ([`sample_pick`]) gets the
//!    token the host would, bit for bit.
//!
//! Ties in top-k / top-p rank lower ids first, so the result is a function of the logits,
//! the history, the parameters and the RNG state only (never of the batch).

use std::collections::HashMap;

use mlaserve_model::draw::{draw_kept, draw_probs, filtered, softmax_prob};
use mlaserve_model::{RowArgmax, RowPick};

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
    // One pass for the checks (and, with no penalty, greedy's answer): this runs on the
    // host after every decode step, on each token's critical path. The reduction and checks
    // of a row reduced on a device (sample_pick), so the two agree by construction.
    let row = RowArgmax::of(logits);
    let greedy = sample_pick(&RowPick {
        argmax: row,
        token_id: row.token_id,
    })?
    .token_id;
    let token_id = if params.is_greedy() && !params.is_penalized() {
        greedy
    } else {
        let mut work = logits.to_vec();
        apply_penalties(&mut work, params, prompt, output);
        if params.is_greedy() {
            argmax(&work)
        } else {
            sample_filtered(&mut work, params, rng)
        }
    };
    let logprob = params.logprobs.map(|n| token_logprob(logits, token_id, n));
    Ok(Sampled { token_id, logprob })
}

/// What [`sample`] returns for a row whose parameters the device can draw by
/// ([`SamplingParams::draws_on_device`]), from that row's device reduction under the
/// parameters' [`SamplingParams::row_draw`]: the same token and the same errors.
pub fn sample_pick(row: &RowPick) -> Result<Sampled, SamplerError> {
    if let Some((index, value)) = row.argmax.first_bad {
        return Err(SamplerError::NonFinite {
            index: index as usize,
            value,
        });
    }
    if row.argmax.max == f32::NEG_INFINITY {
        return Err(SamplerError::AllMasked);
    }
    Ok(Sampled {
        token_id: row.token_id,
        logprob: None,
    })
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
            *l = finite_penalized(*l, if *l > 0.0 { *l / r } else { *l * r });
        }
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output.iter().filter(|&&t| (t as usize) < vocab) {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            let l = &mut logits[t as usize];
            *l = finite_penalized(
                *l,
                *l - (params.presence_penalty + params.frequency_penalty * c as f32),
            );
        }
    }
}

/// A penalized logit kept finite (a tiny repetition penalty overflows a positive logit to
/// +inf, a huge one a negative logit to -inf, and a row of infinities has no softmax), but a
/// masked one (-inf) stays masked.
fn finite_penalized(before: f32, after: f32) -> f32 {
    if before == f32::NEG_INFINITY {
        before
    } else {
        after.clamp(-f32::MAX, f32::MAX)
    }
}

/// Index of the largest value, the lowest index among equals. `-inf` only loses to finite;
/// NaNs are passed over (0 if nothing else is there).
pub fn argmax(values: &[f32]) -> u32 {
    let (max, _) = max_and_bad(values);
    first_eq(values, max).unwrap_or(0) as u32
}

/// The first index holding `x`: 64-value chunks compared whole (vectorized), then the chunk
/// that has it value by value.
fn first_eq(values: &[f32], x: f32) -> Option<usize> {
    const C: usize = 64;
    let j = values
        .chunks(C)
        .position(|c| c.iter().fold(false, |a, &v| a | (v == x)))?;
    values[j * C..]
        .iter()
        .position(|&v| v == x)
        .map(|i| j * C + i)
}

/// The largest value that is not NaN (`-inf` if none) and whether any value is NaN or
/// `+inf`, in 16 independent lanes so the compiler vectorizes it.
fn max_and_bad(values: &[f32]) -> (f32, bool) {
    const L: usize = 16;
    let mut m = [f32::NEG_INFINITY; L];
    let mut bad = [false; L];
    let chunks = values.chunks_exact(L);
    let tail = chunks.remainder();
    let mut step = |i: usize, v: f32| {
        m[i] = if v > m[i] { v } else { m[i] };
        bad[i] |= v.is_nan() | (v == f32::INFINITY);
    };
    for c in chunks {
        for (i, &v) in c.iter().enumerate() {
            step(i, v);
        }
    }
    for (i, &v) in tail.iter().enumerate() {
        step(i, v);
    }
    let max = m
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
    (max, bad.iter().any(|&b| b))
}

/// Temperature, softmax, min-p, top-k, top-p, then one draw. `logits` is consumed as scratch.
fn sample_filtered(logits: &mut [f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    if params.top_p >= 1.0 && params.top_k.is_none() && params.min_p <= 0.0 {
        return sample_unfiltered(logits, params, rng);
    }
    let kept = filtered_probs(logits, params);
    kept[draw_kept(&kept, rng.next_u64()) as usize].0
}

/// Temperature alone (OpenAI's default: temperature 1, top-p 1): the same draw as through
/// [`filtered_probs`] — every token with p > 0, in id order — without building the kept list:
/// the draw a device makes ([`mlaserve_model::RowPick::of`]).
fn sample_unfiltered(logits: &mut [f32], params: &SamplingParams, rng: &mut Rng) -> u32 {
    let prob = unnormalized_prob(logits, params);
    for l in logits.iter_mut() {
        *l = prob(*l);
    }
    draw_probs(logits, rng.next_u64())
}

/// The map from a logit to its unnormalized probability exp((l - max) / T) over this row
/// (the max token's is 1.0; the row holds no NaN here).
fn unnormalized_prob(logits: &[f32], params: &SamplingParams) -> impl Fn(f32) -> f32 {
    let inv_t = params.inv_temperature();
    let (max, _) = max_and_bad(logits);
    move |l| softmax_prob(l, max, inv_t)
}

/// The kept `(token, unnormalized probability)` pairs in id order, never empty when at
/// least one logit is finite ([`mlaserve_model::draw::filtered`], the definition a device
/// draws by too).
pub fn filtered_probs(logits: &mut [f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    let prob = unnormalized_prob(logits, params);
    for l in logits.iter_mut() {
        *l = prob(*l);
    }
    filtered(logits, &params.filter())
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

    /// Greedy sampling (`sample`, which checks and reduces a row as a device does: by
    /// `RowArgmax::of` and `sample_pick`) gives the errors spelt out here and otherwise
    /// `argmax`'s token (the sampler's own scan, which penalized rows take), over ties, masks,
    /// signed zeros, NaN and infinities, in every position of a long row.
    #[test]
    fn greedy_sampling_checks_and_takes_the_rows_argmax() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let mut rows: Vec<Vec<f32>> = vec![
            vec![0.5, 2.0, -1.0, 2.0],
            vec![f32::NEG_INFINITY; 5],
            vec![f32::NEG_INFINITY, -3.0, f32::NEG_INFINITY],
            vec![-0.0, 0.0, -0.0],
            vec![0.0, -0.0],
            vec![1.0, nan, 2.0, inf],
            vec![1.0, inf, nan],
            vec![nan, nan],
            vec![f32::MAX, -f32::MAX, f32::MAX],
            vec![-1e-45, -2e-45],
        ];
        let mut r = Rng::seed_from_u64(5);
        for special in [nan, inf, f32::NEG_INFINITY, 9.0] {
            for at in [0, 63, 64, 1000, 1999] {
                let mut row: Vec<f32> = (0..2000).map(|_| (r.next_f64() * 8.0) as f32).collect();
                row[at] = special;
                row[(at * 7 + 3) % 2000] = 9.0; // a tie with the 9.0 specials
                rows.push(row);
            }
        }
        let p = SamplingParams::greedy(1);
        assert!(p.draws_on_device());
        for row in &rows {
            let mut rng = Rng::seed_from_u64(1);
            let got = sample(row, row.len(), &p, &[], &[], &mut rng);
            let bad = row.iter().position(|v| v.is_nan() || *v == f32::INFINITY);
            let want = match bad {
                Some(index) => Err(SamplerError::NonFinite {
                    index,
                    value: row[index],
                }),
                None if row.iter().all(|&v| v == f32::NEG_INFINITY) => Err(SamplerError::AllMasked),
                None => Ok(Sampled {
                    token_id: argmax(row),
                    logprob: None,
                }),
            };
            match (&got, &want) {
                // NaN != NaN: compare the error's index and bits
                (
                    Err(SamplerError::NonFinite { index: a, value: x }),
                    Err(SamplerError::NonFinite { index: b, value: y }),
                ) => assert_eq!((a, x.to_bits()), (b, y.to_bits()), "{row:?}"),
                _ => assert_eq!(got, want, "{row:?}"),
            }
        }
        // filters leave greedy and draws at a temperature a device's pick
        for f in [
            |p: &mut SamplingParams| p.top_p = 0.9,
            |p: &mut SamplingParams| p.top_k = Some(5),
            |p: &mut SamplingParams| p.min_p = 0.1,
        ] {
            let mut p = SamplingParams::greedy(1);
            f(&mut p);
            assert!(p.draws_on_device(), "{p:?}");
            p.temperature = 0.7;
            assert!(p.draws_on_device(), "{p:?}");
        }
        for f in [
            |p: &mut SamplingParams| p.logprobs = Some(0),
            |p: &mut SamplingParams| p.repetition_penalty = 1.1,
            |p: &mut SamplingParams| p.presence_penalty = 0.5,
            |p: &mut SamplingParams| p.frequency_penalty = -0.5,
        ] {
            let mut p = SamplingParams::greedy(1);
            f(&mut p);
            assert!(!p.draws_on_device(), "{p:?}");
            p.temperature = 0.7;
            assert!(!p.draws_on_device(), "{p:?}");
        }
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

    /// Rows from a seeded generator: lengths around the 16- and 64-value chunks, values from
    /// a small set (so ties are common), some -inf.
    fn rows(seed: u64) -> Vec<Vec<f32>> {
        let mut r = Rng::seed_from_u64(seed);
        [1usize, 15, 16, 17, 63, 64, 65, 200, 1000, 4099]
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|_| match r.next_u64() % 10 {
                        0 => f32::NEG_INFINITY,
                        k => (k as f32 - 5.0) * 0.5 + (r.next_u64() % 3) as f32,
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn vectorized_argmax_and_checks_match_a_plain_scan() {
        let greedy = |row: &[f32]| {
            let p = SamplingParams::greedy(1);
            sample(row, row.len(), &p, &[], &[], &mut Rng::seed_from_u64(0))
        };
        for row in rows(3) {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            assert_eq!(argmax(&row), best as u32, "{row:?}");
            let got = greedy(&row);
            if row.iter().all(|&v| v == f32::NEG_INFINITY) {
                assert_eq!(got, Err(SamplerError::AllMasked));
            } else {
                assert_eq!(got.unwrap().token_id, best as u32);
            }
            // A NaN or +inf anywhere is reported at its first index, wherever the chunks fall.
            for bad in [f32::NAN, f32::INFINITY] {
                for at in [0, row.len() / 2, row.len() - 1] {
                    let mut b = row.clone();
                    b[at] = bad;
                    let e = greedy(&b);
                    assert!(
                        matches!(e, Err(SamplerError::NonFinite { index, .. }) if index == at),
                        "{e:?} at {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn top_p_nucleus_matches_a_full_sort() {
        // The nucleus found a candidate set at a time against the whole-vocabulary sort, on
        // flat rows (the candidate set grows past 256 and 2,048) and peaked ones.
        let mut r = Rng::seed_from_u64(11);
        for (n, spread) in [(300usize, 0.5f32), (5000, 0.2), (5000, 8.0), (20000, 1.0)] {
            let row: Vec<f32> = (0..n)
                .map(|_| (r.next_f64() as f32 - 0.5) * spread)
                .collect();
            for top_p in [0.1f32, 0.5, 0.9, 0.99] {
                let p = params(|p| p.top_p = top_p);
                let mut probs: Vec<(u32, f32)> = row
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| {
                        (
                            i as u32,
                            softmax_prob(l, row.iter().copied().fold(f32::MIN, f32::max), 1.0),
                        )
                    })
                    .collect();
                probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let total: f64 = probs.iter().map(|&(_, q)| q as f64).sum();
                let mut cum = 0.0;
                let k = probs
                    .iter()
                    .position(|&(_, q)| {
                        cum += q as f64;
                        cum >= top_p as f64 * total
                    })
                    .map_or(probs.len(), |i| i + 1);
                let mut want: Vec<u32> = probs[..k].iter().map(|&(id, _)| id).collect();
                want.sort_unstable();
                assert_eq!(
                    kept_ids(&row, &p),
                    want,
                    "n {n} spread {spread} top_p {top_p}"
                );
            }
        }
    }

    #[test]
    fn extreme_penalties_keep_a_finite_row() {
        // repetition_penalty 1e-39 (valid: finite, > 0) takes logit 4 past f32::MAX; 1e38 takes
        // -5 past -f32::MAX. The first used to leave the softmax no finite logit (a panic).
        let logits = [5.0f32, 4.0, -5.0, f32::NEG_INFINITY];
        for (r, seen) in [(1e-39f32, vec![0u32, 1]), (1e38, vec![2u32])] {
            for temperature in [0.0f32, 1.0] {
                let p = params(|p| {
                    p.repetition_penalty = r;
                    p.temperature = temperature;
                });
                let s = sample(&logits, 4, &p, &seen, &[], &mut Rng::seed_from_u64(5)).unwrap();
                assert!(s.token_id < 3, "r {r} t {temperature}: {s:?}");
            }
        }
        let mut l = logits.to_vec();
        apply_penalties(
            &mut l,
            &params(|p| p.repetition_penalty = 1e-39),
            &[0, 1, 3],
            &[],
        );
        assert_eq!(l, [f32::MAX, f32::MAX, -5.0, f32::NEG_INFINITY]);
        let mut l = logits.to_vec();
        apply_penalties(&mut l, &params(|p| p.repetition_penalty = 1e38), &[2], &[]);
        assert_eq!(l, [5.0, 4.0, -f32::MAX, f32::NEG_INFINITY]);
    }

    #[test]
    fn temperature_alone_draws_as_the_kept_list_does() {
        // The one-pass path against the general one (filtered_probs with a top-k that keeps
        // every token, then the CDF walk), on the same rows and RNG states: the same token,
        // bit for bit (integer weights), and the device's reference draw the same again.
        let mut r = Rng::seed_from_u64(21);
        for n in [1usize, 7, 8, 9, 1000, 4099] {
            let mut row: Vec<f32> = (0..n).map(|_| (r.next_f64() as f32 - 0.5) * 16.0).collect();
            if n > 8 {
                row[3] = f32::NEG_INFINITY;
                row[n - 1] = -200.0; // exp underflows to 0: never drawn
            }
            for t in [0.3f32, 1.0, 2.0] {
                let p = params(|p| p.temperature = t);
                let all = params(|p| {
                    p.temperature = t;
                    p.top_k = Some(n);
                });
                for seed in 0..200 {
                    let fast =
                        sample_unfiltered(&mut row.clone(), &p, &mut Rng::seed_from_u64(seed));
                    let want =
                        sample_filtered(&mut row.clone(), &all, &mut Rng::seed_from_u64(seed));
                    assert_eq!(fast, want, "n {n} t {t} seed {seed}");
                    let draw = p.row_draw(&mut Rng::seed_from_u64(seed));
                    assert_eq!(
                        RowPick::of(&row, draw).token_id,
                        fast,
                        "n {n} t {t} seed {seed}"
                    );
                    assert!(row[fast as usize] > -150.0);
                }
            }
        }
    }

    /// Every draw the device makes (`RowPick::of` under the parameters' `row_draw`) is the
    /// token `sample` draws from the whole row, with top-k, top-p and min-p alone and together,
    /// on flat and peaked rows with ties and masked tokens.
    #[test]
    fn filtered_draws_are_the_device_references() {
        let mut r = Rng::seed_from_u64(33);
        for (n, spread) in [(50usize, 0.0f32), (3000, 0.5), (3000, 12.0), (20000, 3.0)] {
            let mut row: Vec<f32> = (0..n)
                .map(|_| ((r.next_f64() as f32 - 0.5) * spread * 8.0).round() / 8.0)
                .collect();
            row[n / 3] = f32::NEG_INFINITY;
            for (t, top_k, top_p, min_p) in [
                (1.0f32, Some(1usize), 1.0f32, 0.0f32),
                (0.7, Some(40), 1.0, 0.0),
                (1.0, None, 0.9, 0.0),
                (1.3, None, 0.5, 0.0),
                (0.8, None, 1.0, 0.05),
                (0.8, Some(100), 0.95, 0.01),
                (2.0, Some(n + 5), 0.999, 0.0),
            ] {
                let p = params(|p| {
                    p.temperature = t;
                    p.top_k = top_k;
                    p.top_p = top_p;
                    p.min_p = min_p;
                });
                assert!(p.draws_on_device());
                for seed in 0..40 {
                    let got = sample(&row, n, &p, &[], &[], &mut Rng::seed_from_u64(seed))
                        .unwrap()
                        .token_id;
                    let draw = p.row_draw(&mut Rng::seed_from_u64(seed));
                    let want = RowPick::of(&row, draw).token_id;
                    assert_eq!(got, want, "n {n} spread {spread} {p:?} seed {seed}");
                }
            }
        }
    }
}
