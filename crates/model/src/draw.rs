//! One token drawn from `softmax(row / temperature)`, defined so that a GPU and the host
//! draw the same token from the same random number, bit for bit.
//!
//! A float softmax summed in two orders (a warp tree on the device, id order on the host)
//! can put a draw on either side of a CDF boundary. So the draw is done in integers:
//! 1. each logit's probability relative to the row's max, `p = exp((l - max) / T)`, is
//!    computed by [`softmax_prob`] from f32 adds and multiplies alone (no library `exp`, no
//!    fused multiply-add), the same IEEE operations in `pick.cu`'s `softmax_prob`;
//! 2. its weight is `p · 2^40` truncated to an integer ([`weight`]; tokens with
//!    `p < 2^-40` weigh 0 and are never drawn);
//! 3. a [`Filter`] keeps min-p (`p >= min_p`), top-k (the k best by rank: p descending, lower
//!    id first) and top-p (the shortest rank-order prefix whose weights reach
//!    `ceil(top_p · total)`, in integers too: [`filtered`]);
//! 4. a 64-bit random number `r` picks `target = (r · total) >> 64` — an integer in
//!    `[0, total)` over the kept weights — and the token is the first kept one, in id order,
//!    whose running weight passes it ([`draw_weights`]).
//!
//! Integer sums are exact in any order, so the device's tree and the host's scan agree.
//! Invariant: [`RowPick::of`] is the definition every executor's reduction matches.

use crate::executor::RowArgmax;

/// Weights are fixed-point with this many fraction bits: the max token weighs `2^40`.
pub const WEIGHT_BITS: i32 = 40;

/// Which tokens a draw may pick ([`filtered`]); every field at its "off" value keeps every
/// token with a weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Filter {
    /// Keep the k best (0: off).
    pub top_k: u32,
    /// Keep the nucleus reaching this share of the weight (>= 1: off).
    pub top_p: f32,
    /// Keep tokens with `p >= min_p` (the max's p is 1; <= 0: off).
    pub min_p: f32,
}

impl Filter {
    pub const NONE: Filter = Filter {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };

    pub fn is_none(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0 && self.min_p <= 0.0
    }
}

/// How one logits row becomes a token on the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowDraw {
    /// Greedy: the row's argmax.
    Argmax,
    /// The host samples from the whole row (penalties, logprobs): the executor hands the row
    /// back; its pick is the argmax's.
    Whole,
    /// One draw from `softmax(row · inv_temperature)` over the tokens `filter` keeps
    /// ([`draw_weights`]) by `random`, the next 64 bits of the sequence's own random stream.
    Softmax {
        inv_temperature: f32,
        random: u64,
        filter: Filter,
    },
}

impl RowDraw {
    /// Whether this draw is one the weights are defined for: 1/temperature finite and above 0
    /// (so every p lies in [0, 1]), top_p in (0, 1] and min_p in [0, 1] where filtered (the
    /// ranges `SamplingParams::validate` enforces). The message names the draw.
    pub fn check(&self) -> Result<(), String> {
        let ok = match *self {
            RowDraw::Softmax {
                inv_temperature: t,
                filter: f,
                ..
            } => {
                t.is_finite()
                    && t > 0.0
                    && f.top_p > 0.0
                    && f.top_p <= 1.0
                    && (0.0..=1.0).contains(&f.min_p)
            }
            RowDraw::Argmax | RowDraw::Whole => true,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "a draw needs 1/temperature finite and above 0, top_p in (0, 1] and min_p in \
                 [0, 1]: {self:?}"
            ))
        }
    }
}

/// What a device hands back for one row: its [`RowArgmax`] (the sampler's checks read it)
/// and the token its [`RowDraw`] chose (the argmax's for `Argmax`, and for a row no sampler
/// can use: one with NaN / +inf or no value above -inf).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowPick {
    pub argmax: RowArgmax,
    pub token_id: u32,
}

impl RowPick {
    /// The reference reduction of one row.
    pub fn of(row: &[f32], draw: RowDraw) -> Self {
        let argmax = RowArgmax::of(row);
        let token_id = match draw {
            RowDraw::Softmax {
                inv_temperature,
                random,
                filter,
            } if argmax.first_bad.is_none() && argmax.max > f32::NEG_INFINITY => {
                let probs: Vec<f32> = row
                    .iter()
                    .map(|&l| softmax_prob(l, argmax.max, inv_temperature))
                    .collect();
                if filter.is_none() {
                    draw_probs(&probs, random)
                } else {
                    let kept = filtered(&probs, &filter);
                    kept[draw_kept(&kept, random) as usize].0
                }
            }
            _ => argmax.token_id,
        };
        Self { argmax, token_id }
    }
}

/// `exp((l - max) · inv_t)` for `l <= max` (a row's logit and its max), in `(0, 1]`, or 0
/// where that is below `e^-28` (so weighs less than 1 in 2^40: -inf logits too). Range
/// reduction to `2^n · 2^f`, `|f| <= 1/2`, then Cephes' degree-6 polynomial for `2^f` (about
/// 2 ulp): only IEEE f32 adds and multiplies in a fixed order, which `pick.cu` repeats
/// with `__fadd_rn` / `__fmul_rn` (never contracted to FMAs), so both give the same bits.
#[inline]
pub fn softmax_prob(l: f32, max: f32, inv_t: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5 · 2^23: t + SHIFTER rounds t to an integer
    let x = (l - max) * inv_t;
    let t = x * std::f32::consts::LOG2_E; // (-40.4, 0] where it counts
    let r = t + SHIFTER;
    let n = r - SHIFTER; // round-to-nearest-even(t), in [-40, 0]
    let f = t - n; // [-1/2, 1/2]
    let mut p = 1.535_336_2e-4_f32;
    p = p * f + 1.339_887_4e-3;
    p = p * f + 9.618_437e-3;
    p = p * f + 5.550_332_5e-2;
    p = p * f + 2.402_264_8e-1;
    p = p * f + 6.931_472e-1;
    p = p * f + 1.0;
    let e = (r.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32); // n as an integer
    let v = p * f32::from_bits((e.wrapping_add(127) as u32) << 23);
    // computed for every x (no branch: the loops over a row vectorize), kept where it counts:
    // 0 for -inf logits, NaN, and probabilities below 2^-40 (x <= -28)
    if x > -28.0 {
        v
    } else {
        0.0
    }
}

/// A probability's fixed-point weight: `p · 2^40` (exact), truncated (below 2^41: in i64's
/// range, whose conversion is one instruction on x86-64).
#[inline]
pub fn weight(p: f32) -> u64 {
    (p * (1u64 << WEIGHT_BITS) as f32) as i64 as u64
}

/// The draw over a row's probabilities ([`softmax_prob`] of each logit):
/// [`draw_weights`] of their weights.
pub fn draw_probs(probs: &[f32], random: u64) -> u32 {
    let total = probs.iter().map(|&p| weight(p)).sum();
    draw_weights(probs.iter().map(|&p| weight(p)), total, random)
}

/// [`RowPick::of`] each row of `logits` (`[draws.len(), vocab]`, rows in parallel) into
/// `out`, and the rows whose draw is [`RowDraw::Whole`] copied into `whole`, in order: what
/// [`crate::Executor::forward_picks`] hands back, from logits on the host.
pub fn picks_of(
    logits: &[f32],
    vocab: usize,
    draws: &[RowDraw],
    out: &mut Vec<RowPick>,
    whole: &mut Vec<f32>,
) -> Result<(), crate::ModelError> {
    use rayon::prelude::*;
    if vocab == 0 || logits.len() != draws.len() * vocab {
        return Err(crate::ModelError::Batch(format!(
            "{} logits are not {} rows of {vocab}",
            logits.len(),
            draws.len()
        )));
    }
    if let Some(e) = draws.iter().find_map(|d| d.check().err()) {
        return Err(crate::ModelError::Batch(e));
    }
    out.clear();
    logits
        .par_chunks_exact(vocab)
        .zip(draws)
        .map(|(row, &d)| RowPick::of(row, d))
        .collect_into_vec(out);
    whole.clear();
    for (row, d) in logits.chunks_exact(vocab).zip(draws) {
        if *d == RowDraw::Whole {
            whole.extend_from_slice(row);
        }
    }
    Ok(())
}

/// The index into `kept` ([`filtered`]'s `(id, p)` pairs) of the draw by `random` over their
/// weights.
pub fn draw_kept(kept: &[(u32, f32)], random: u64) -> u32 {
    let total = kept.iter().map(|&(_, p)| weight(p)).sum();
    draw_weights(kept.iter().map(|&(_, p)| weight(p)), total, random)
}

/// The weight top-p's nucleus must reach: `ceil(top_p · total)` in f64 (`total` rounded to
/// f64 first), at most `total`, as `pick.cu` computes it.
pub fn nucleus_target(total: u64, top_p: f32) -> u64 {
    ((top_p as f64 * total as f64).ceil() as u64).min(total)
}

/// The tokens `f` keeps of a row's probabilities ([`softmax_prob`] of each logit), as
/// `(id, p)` in id order; never empty when the row has a p of 1 (its max). min-p first
/// (`p > 0` and `p >= min_p`), then top-k of those by rank (p descending, lower id first),
/// then top-p of those: the shortest rank-order prefix whose running weight reaches
/// [`nucleus_target`] of their total weight.
pub fn filtered(probs: &[f32], f: &Filter) -> Vec<(u32, f32)> {
    let min_keep = if f.min_p > 0.0 { f.min_p } else { 0.0 };
    let k0 = |_: usize, p: f32| p > 0.0 && p >= min_keep;
    let k = f.top_k as u64;
    let cut_k = if k > 0 && k < probs.iter().filter(|&&p| k0(0, p)).count() as u64 {
        Some(rank_cut(probs, k0, k, |_| 1))
    } else {
        None
    };
    let k1 = |i: usize, p: f32| k0(i, p) && cut_k.is_none_or(|c| ranks_within((i as u32, p), c));
    let cut_p = if f.top_p < 1.0 {
        let total = kept_measure(probs, k1, weight);
        Some(rank_cut(probs, k1, nucleus_target(total, f.top_p), weight))
    } else {
        None
    };
    probs
        .iter()
        .enumerate()
        .filter(|&(i, &p)| k1(i, p) && cut_p.is_none_or(|c| ranks_within((i as u32, p), c)))
        .map(|(i, &p)| (i as u32, p))
        .collect()
}

/// The sum of `measure` over the tokens `keep` keeps.
fn kept_measure(
    probs: &[f32],
    keep: impl Fn(usize, f32) -> bool,
    measure: impl Fn(f32) -> u64,
) -> u64 {
    let mut sum = 0;
    for (i, &p) in probs.iter().enumerate() {
        if keep(i, p) {
            sum += measure(p);
        }
    }
    sum
}

/// Whether `(id, p)` ranks at or above `cut` (p descending, lower id first among equals).
fn ranks_within((id, p): (u32, f32), cut: (u32, f32)) -> bool {
    p > cut.1 || (p == cut.1 && id <= cut.0)
}

/// The last token, in rank order (p descending, lower id first), of the shortest rank-order
/// prefix of the tokens `keep` keeps whose running `measure` reaches `need` (at least 1, at
/// most their whole sum). A radix select on the probabilities' bits (monotone for p >= 0), ten
/// bits at a time from bit 29 (p <= 1 leaves 30 and 31 clear), the first digit over the row,
/// the next over the tokens that share it, then the tied tokens by id: O(n) where a sort of
/// the candidates is O(n log n).
fn rank_cut(
    probs: &[f32],
    keep: impl Fn(usize, f32) -> bool,
    need: u64,
    measure: impl Fn(f32) -> u64,
) -> (u32, f32) {
    let digit = |p: f32, shift: u32| ((p.to_bits() >> shift) & 0x3FF) as usize;
    // the digit of the bin where the running measure, from the top bin down, reaches `need`
    // (which becomes the need within it)
    let pick = |bins: &[u64], need: &mut u64| -> usize {
        for d in (0..bins.len()).rev() {
            if bins[d] >= *need {
                return d;
            }
            *need -= bins[d];
        }
        0 // `need` past the sum: not reached by callers
    };
    let mut need = need.max(1);
    let mut bins = vec![0u64; 1024];
    for (i, &p) in probs.iter().enumerate() {
        if keep(i, p) {
            bins[digit(p, 20)] += measure(p);
        }
    }
    let d = pick(&bins, &mut need);
    let mut cands: Vec<(u32, f32)> = probs
        .iter()
        .enumerate()
        .filter(|&(i, &p)| keep(i, p) && digit(p, 20) == d)
        .map(|(i, &p)| (i as u32, p))
        .collect();
    for shift in [10u32, 0] {
        bins.fill(0);
        for &(_, p) in &cands {
            bins[digit(p, shift)] += measure(p);
        }
        let d = pick(&bins, &mut need);
        cands.retain(|&(_, p)| digit(p, shift) == d);
    }
    // one key left: ties in id order
    let mut cum = 0u64;
    for &t in &cands {
        cum += measure(t.1);
        if cum >= need {
            return t;
        }
    }
    *cands
        .last()
        .expect("a bin that reached `need` holds tokens")
}

/// The index, in iteration order, of the first weight whose running sum passes
/// `(random · total) >> 64`. `total` must be the weights' sum and above 0; past the end (only
/// if it is not) the last index.
pub fn draw_weights(weights: impl Iterator<Item = u64>, total: u64, random: u64) -> u32 {
    let target = ((random as u128 * total as u128) >> 64) as u64;
    let mut cum = 0u64;
    let mut last = 0;
    for (i, w) in weights.enumerate() {
        cum += w;
        last = i;
        if cum > target {
            return i as u32;
        }
    }
    last as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_prob_is_close_to_exp() {
        for &inv_t in &[0.5f32, 1.0, 1.7, 10.0] {
            for i in 0..4000 {
                let l = -(i as f32) * 0.007;
                let want = ((l as f64) * inv_t as f64).exp();
                let got = softmax_prob(l, 0.0, inv_t) as f64;
                if want < (-28f64).exp() {
                    assert_eq!(got, 0.0, "l {l} inv_t {inv_t}");
                } else {
                    // f32 rounding of x and of x · log2(e) alone: ~1.2e-7 · |x| relative
                    let tol = 1e-6 + 1.5e-7 * (l * inv_t).abs() as f64;
                    assert!(
                        (got / want - 1.0).abs() < tol,
                        "l {l} inv_t {inv_t}: {got} vs {want}"
                    );
                }
            }
        }
        assert_eq!(softmax_prob(3.0, 3.0, 1.0), 1.0);
        assert_eq!(softmax_prob(f32::NEG_INFINITY, 3.0, 1.0), 0.0);
        assert_eq!(weight(1.0), 1 << 40);
    }

    #[test]
    fn draws_follow_the_weights_and_the_targets_edges() {
        let w = [0u64, 3, 0, 5, 2];
        // target = floor(r · 10 / 2^64): 0..3 -> token 1, 3..8 -> 3, 8..10 -> 4; zeros never
        let at = |t: u128| draw_weights(w.iter().copied(), 10, (t << 64).div_ceil(10) as u64);
        for (t, want) in [(0, 1), (2, 1), (3, 3), (7, 3), (8, 4), (9, 4)] {
            assert_eq!(at(t), want, "target {t}");
        }
        assert_eq!(draw_weights(w.iter().copied(), 10, u64::MAX), 4);
        assert_eq!(draw_weights(w.iter().copied(), 10, 0), 1);
    }

    #[test]
    fn picks_draw_in_proportion_and_keep_the_argmax_checks() {
        let row = [1.0f32, 2.0, f32::NEG_INFINITY, 0.5];
        let mut counts = [0usize; 4];
        let n = 20_000u64;
        for k in 0..n {
            let random = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let p = RowPick::of(
                &row,
                RowDraw::Softmax {
                    inv_temperature: 1.0,
                    random,
                    filter: Filter::NONE,
                },
            );
            assert_eq!(p.argmax, RowArgmax::of(&row));
            counts[p.token_id as usize] += 1;
        }
        let z: f64 = [1.0f64, 2.0, 0.5].iter().map(|l| l.exp()).sum();
        for (i, l) in [(0, 1.0f64), (1, 2.0), (3, 0.5)] {
            let want = l.exp() / z;
            let got = counts[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
        assert_eq!(counts[2], 0);
        let bad = [1.0f32, f32::NAN, 3.0];
        let draw = RowDraw::Softmax {
            inv_temperature: 1.0,
            random: 7,
            filter: Filter::NONE,
        };
        assert_eq!(
            RowPick::of(&bad, draw).token_id,
            RowArgmax::of(&bad).token_id
        );
        assert_eq!(RowPick::of(&row, RowDraw::Argmax).token_id, 1);
    }

    /// `filtered` against its definition by a full sort, on flat rows (many ties: most of a
    /// row in one radix bin), peaked ones and rows of few distinct values, every filter kind.
    #[test]
    fn filtered_is_the_sorted_definition() {
        let naive = |probs: &[f32], f: &Filter| -> Vec<(u32, f32)> {
            let min_keep = if f.min_p > 0.0 { f.min_p } else { 0.0 };
            let mut kept: Vec<(u32, f32)> = probs
                .iter()
                .enumerate()
                .filter(|(_, &p)| p > 0.0 && p >= min_keep)
                .map(|(i, &p)| (i as u32, p))
                .collect();
            kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if f.top_k > 0 {
                kept.truncate(f.top_k as usize);
            }
            if f.top_p < 1.0 {
                let total = kept.iter().map(|&(_, p)| weight(p)).sum();
                let target = nucleus_target(total, f.top_p);
                let mut cum = 0;
                let n = kept
                    .iter()
                    .position(|&(_, p)| {
                        cum += weight(p);
                        cum >= target
                    })
                    .map_or(kept.len(), |i| i + 1);
                kept.truncate(n.max(1));
            }
            kept.sort_by_key(|&(id, _)| id);
            kept
        };
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        for (n, spread, levels) in [
            (1000usize, 0.02f32, 0u32),
            (5000, 4.0, 0),
            (5000, 20.0, 0),
            (3000, 6.0, 7),
            (40, 1.0, 3),
        ] {
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    let v = (next() as f32 - 0.5) * spread;
                    if levels > 0 {
                        (v * levels as f32).round() / levels as f32
                    } else {
                        v
                    }
                })
                .collect();
            let max = logits.iter().copied().fold(f32::MIN, f32::max);
            let probs: Vec<f32> = logits.iter().map(|&l| softmax_prob(l, max, 1.0)).collect();
            for f in [
                Filter {
                    top_k: 1,
                    ..Filter::NONE
                },
                Filter {
                    top_k: 37,
                    ..Filter::NONE
                },
                Filter {
                    top_k: n as u32 - 1,
                    ..Filter::NONE
                },
                Filter {
                    top_p: 0.1,
                    ..Filter::NONE
                },
                Filter {
                    top_p: 0.9,
                    ..Filter::NONE
                },
                Filter {
                    top_p: 0.999,
                    ..Filter::NONE
                },
                Filter {
                    min_p: 0.3,
                    ..Filter::NONE
                },
                Filter {
                    top_k: 50,
                    top_p: 0.95,
                    min_p: 0.01,
                },
            ] {
                assert_eq!(
                    filtered(&probs, &f),
                    naive(&probs, &f),
                    "n {n} spread {spread} {f:?}"
                );
            }
        }
    }

    /// Draws outside the weights' ranges are errors from `picks_of`, not panics or garbage.
    #[test]
    fn bad_draws_are_refused() {
        let logits = [0.0f32, 1.0, 2.0];
        let draw = |inv_temperature: f32, top_p: f32, min_p: f32| RowDraw::Softmax {
            inv_temperature,
            random: 1,
            filter: Filter {
                top_k: 0,
                top_p,
                min_p,
            },
        };
        for bad in [
            draw(-1.0, 1.0, 0.0),
            draw(f32::NAN, 1.0, 0.0),
            draw(f32::INFINITY, 1.0, 0.0),
            draw(1.0, 0.0, 0.0),
            draw(1.0, 1.0, 1.5),
        ] {
            let (mut out, mut whole) = (Vec::new(), Vec::new());
            let e = picks_of(&logits, 3, &[bad], &mut out, &mut whole).unwrap_err();
            assert!(e.to_string().contains("a draw needs"), "{e}");
        }
        let (mut out, mut whole) = (Vec::new(), Vec::new());
        picks_of(&logits, 3, &[draw(2.0, 0.9, 0.1)], &mut out, &mut whole).unwrap();
        assert_eq!(out.len(), 1);
    }
}
