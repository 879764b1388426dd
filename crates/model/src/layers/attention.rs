//! Softmax attention of one query head over a set of keys, and the log-sum-exp merge.
//!
//! Keys are split into two parts whose dot products add: `q·k = qa·ka + qb·kb` (nope|rope in
//! the unabsorbed path, latent|rope in the absorbed one). Scores are `scale * q·k`; the output
//! is `sum_j softmax_j * v_j`, and the returned LSE is `ln(sum_j exp(score_j))`, natural log,
//! `-inf` for an empty key set (whose output is zero). Two partial results over disjoint key
//! sets merge exactly: `out = (o1*e^(lse1-m) + o2*e^(lse2-m)) / (e^(lse1-m) + e^(lse2-m))`.

use mlaserve_backend::{axpy, axpy_rows, dot_f32};

/// Queries a block of [`attend_causal`] shares value loads over.
const Q_BLOCK: usize = 4;

/// One query against `keys` (indices into the accessor). `scores` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn attend<'a, F>(
    keys: &[usize],
    key: F,
    qa: &[f32],
    qb: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> f32
where
    F: Fn(usize) -> (&'a [f32], &'a [f32], &'a [f32]),
{
    out.fill(0.0);
    if keys.is_empty() {
        return f32::NEG_INFINITY;
    }
    scores.clear();
    let mut m = f32::NEG_INFINITY;
    for &j in keys {
        let (ka, kb, _) = key(j);
        let s = scale * (dot_f32(qa, ka) + dot_f32(qb, kb));
        m = m.max(s);
        scores.push(s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - m).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    for (&j, &p) in keys.iter().zip(scores.iter()) {
        let (_, _, v) = key(j);
        axpy(out, p * inv, v);
    }
    m + sum.ln()
}

/// Causal attention of one head's `qlen` queries over their own keys, query i seeing keys
/// `0..=i` (a prompt without cached context): `out` `[qlen, d_v]` is bit for bit [`attend`]
/// of each query over `0..=i` (the same scores, softmax and value sums in the same order);
/// the value sums of [`Q_BLOCK`] queries share each value row's loads ([`axpy_rows`]).
/// `query(i)` is query i's `(qa, qb)`, `key(j)` key j's `(ka, kb)`; value j is
/// `vals[v_off + j * v_stride..][..d_v]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_causal<'a, 'q, F, Q>(
    qlen: usize,
    key: F,
    query: Q,
    scale: f32,
    vals: &[f32],
    v_off: usize,
    v_stride: usize,
    d_v: usize,
    out: &mut [f32],
) where
    F: Fn(usize) -> (&'a [f32], &'a [f32]),
    Q: Fn(usize) -> (&'q [f32], &'q [f32]),
{
    assert_eq!(out.len(), qlen * d_v, "attend_causal: output length");
    let mut weights: Vec<Vec<f32>> = vec![Vec::new(); Q_BLOCK];
    for i0 in (0..qlen).step_by(Q_BLOCK) {
        let nb = Q_BLOCK.min(qlen - i0);
        for (b, w) in weights.iter_mut().enumerate().take(nb) {
            // attend's arithmetic over keys 0..=i, its `p * inv` kept for the value sums.
            let (qa, qb) = query(i0 + b);
            w.clear();
            let mut m = f32::NEG_INFINITY;
            for j in 0..=i0 + b {
                let (ka, kb) = key(j);
                let s = scale * (dot_f32(qa, ka) + dot_f32(qb, kb));
                m = m.max(s);
                w.push(s);
            }
            let mut sum = 0f32;
            for s in w.iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            for p in w.iter_mut() {
                *p *= inv;
            }
        }
        let a: Vec<&[f32]> = weights[..nb].iter().map(|w| w.as_slice()).collect();
        axpy_rows(
            &mut out[i0 * d_v..(i0 + nb) * d_v],
            d_v,
            &a,
            vals,
            v_off,
            v_stride,
        );
    }
}

/// Merge partial result (o2, lse2) into (o1, lse1) in place; returns the merged LSE.
pub fn merge(o1: &mut [f32], lse1: f32, o2: &[f32], lse2: f32) -> f32 {
    if lse2 == f32::NEG_INFINITY {
        return lse1;
    }
    if lse1 == f32::NEG_INFINITY {
        o1.copy_from_slice(o2);
        return lse2;
    }
    let m = lse1.max(lse2);
    let (w1, w2) = ((lse1 - m).exp(), (lse2 - m).exp());
    let inv = 1.0 / (w1 + w2);
    for (a, &b) in o1.iter_mut().zip(o2) {
        *a = (*a * w1 + b * w2) * inv;
    }
    m + (w1 + w2).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_blocks_are_attend_bit_for_bit() {
        let (qlen, p, r, v, n, hd) = (11, 24, 8, 40, 3, 1);
        let f = |i: usize, k: f32| ((i as f32) * k).sin();
        let q: Vec<f32> = (0..qlen * (p + r)).map(|i| f(i, 0.37)).collect();
        let k_nope: Vec<f32> = (0..qlen * n * p).map(|i| f(i, 0.53)).collect();
        let kpe: Vec<f32> = (0..qlen * r).map(|i| f(i, 0.71)).collect();
        let vals: Vec<f32> = (0..qlen * n * v).map(|i| f(i, 0.19)).collect();
        let key = |j: usize| {
            (
                &k_nope[(j * n + hd) * p..(j * n + hd + 1) * p],
                &kpe[j * r..(j + 1) * r],
            )
        };
        let query = |i: usize| q[i * (p + r)..(i + 1) * (p + r)].split_at(p);
        let mut got = vec![f32::NAN; qlen * v];
        attend_causal(qlen, key, query, 0.3, &vals, hd * v, n * v, v, &mut got);
        let mut s = Vec::new();
        for i in 0..qlen {
            let keys: Vec<usize> = (0..=i).collect();
            let mut want = vec![0f32; v];
            let (qa, qb) = query(i);
            let acc = |j: usize| {
                let (ka, kb) = key(j);
                (ka, kb, &vals[(j * n + hd) * v..(j * n + hd + 1) * v])
            };
            attend(&keys, acc, qa, qb, 0.3, &mut s, &mut want);
            assert_eq!(&got[i * v..(i + 1) * v], &want[..], "query {i}");
        }
    }

    #[test]
    fn split_attention_merges_to_the_whole() {
        // 5 keys of (ka 3, kb 2, v 4) random-ish values.
        let ka: Vec<Vec<f32>> = (0..5)
            .map(|j| {
                (0..3)
                    .map(|i| ((i * 7 + j * 3) % 5) as f32 * 0.3 - 0.5)
                    .collect()
            })
            .collect();
        let kb: Vec<Vec<f32>> = (0..5)
            .map(|j| (0..2).map(|i| ((i + j * 2) % 3) as f32 * 0.2).collect())
            .collect();
        let v: Vec<Vec<f32>> = (0..5)
            .map(|j| (0..4).map(|i| (i * j) as f32 * 0.1 - 0.3).collect())
            .collect();
        let acc = |j: usize| (ka[j].as_slice(), kb[j].as_slice(), v[j].as_slice());
        let (qa, qb) = ([0.4, -0.2, 0.9], [0.5, 0.1]);
        let mut s = Vec::new();
        let mut whole = [0f32; 4];
        let lse = attend(&[0, 1, 2, 3, 4], acc, &qa, &qb, 0.7, &mut s, &mut whole);
        let mut a = [0f32; 4];
        let mut b = [0f32; 4];
        let l1 = attend(&[0, 1], acc, &qa, &qb, 0.7, &mut s, &mut a);
        let l2 = attend(&[2, 3, 4], acc, &qa, &qb, 0.7, &mut s, &mut b);
        let l = merge(&mut a, l1, &b, l2);
        assert!((l - lse).abs() < 1e-5);
        for i in 0..4 {
            assert!((a[i] - whole[i]).abs() < 1e-5, "{a:?} vs {whole:?}");
        }
        // Empty parts are neutral.
        let mut e = [0f32; 4];
        let le = attend(&[], acc, &qa, &qb, 0.7, &mut s, &mut e);
        assert_eq!(le, f32::NEG_INFINITY);
        let l3 = merge(&mut e, le, &whole, lse);
        assert_eq!(l3, lse);
        assert_eq!(e, whole);
    }
}
