//! Token choice on the GPU: greedy argmax, temperature, top-k / top-p / min-p draws.

use super::*;

/// Logits rows reduced to their pick on the device (`logits_pick`, what steps without
/// penalties or logprobs ship to the host): every field of `RowPick::of` each row — the
/// argmax's and the drawn token, bit for bit — with every row greedy (no draws), with
/// draws at temperatures 0.3-2 (a greedy row among them), and with those draws under top-k,
/// top-p, min-p and all three, over vocabularies whose rows load
/// as float4 and as scalars, with ties, signed zeros, masked (-inf) rows and values, NaN and
/// +inf anywhere. The error is the number of rows that differ.
pub(super) fn logits_pick(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_model::{Filter, RowDraw, RowPick};
    // 154,880 and 40,001: a warp's segment of more than 32 steps (float4 and scalar loads)
    let shapes = [
        (1, 102_400),
        (5, 1_001),
        (13, 4_096),
        (64, 102_400),
        (3, 7),
        (14, 154_880),
        (14, 40_001),
    ];
    for &(rows, vocab) in &shapes {
        let mut x = rng.vec(rows * vocab, 8.0);
        for r in 0..rows {
            let row = &mut x[r * vocab..][..vocab];
            match r % 7 {
                1 => {
                    let m = row.iter().cloned().fold(f32::MIN, f32::max);
                    for _ in 0..3 {
                        row[rng.below(vocab)] = m + 1.0; // a tie, the lowest index wins
                    }
                }
                2 => row.fill(f32::NEG_INFINITY),
                3 => row[rng.below(vocab)] = f32::NAN,
                4 => {
                    row[rng.below(vocab)] = f32::INFINITY;
                    row[rng.below(vocab)] = f32::NAN;
                }
                5 => {
                    row.fill(0.0);
                    for _ in 0..vocab / 2 {
                        row[rng.below(vocab)] = -0.0;
                    }
                }
                6 => {
                    for _ in 0..vocab / 3 {
                        row[rng.below(vocab)] = f32::NEG_INFINITY;
                    }
                    if vocab > 32_768 {
                        row.iter_mut().for_each(|v| *v *= 0.01); // near uniform: deep draws
                    }
                }
                // nothing usable: an unusable value, then only -inf (token 0, not 1)
                0 if r > 0 => {
                    row.fill(f32::NEG_INFINITY);
                    row[0] = if r % 2 == 0 { f32::NAN } else { f32::INFINITY };
                }
                _ => {}
            }
        }
        for (c, (drawn, filtered)) in pick_clusters(gpu)
            .into_iter()
            .flat_map(|c| [(false, false), (true, false), (true, true)].map(|k| (c, k)))
        {
            let r4 = |rng: &mut Rng| rng.below(4);
            // filtered draws overwrite their rows: a fresh copy each pass
            let xd = gpu.upload(&x).unwrap();
            // filters by row: none, top-k, top-p, min-p, all three
            let filters = [
                Filter::NONE,
                Filter {
                    top_k: [1, 7, 50, 5_000][r4(rng)],
                    ..Filter::NONE
                },
                Filter {
                    top_p: [0.3, 0.9, 0.95, 0.999][r4(rng)],
                    ..Filter::NONE
                },
                Filter {
                    min_p: [0.01, 0.1, 0.5, 1.0][r4(rng)],
                    ..Filter::NONE
                },
                Filter {
                    top_k: 40,
                    top_p: 0.9,
                    min_p: 0.02,
                },
            ];
            let draws: Vec<RowDraw> = (0..rows)
                .map(|r| match drawn && r % 5 != 4 {
                    false => RowDraw::Argmax,
                    true => RowDraw::Softmax {
                        inv_temperature: [1.0f32, 1.0 / 0.3, 0.5, 1.0 / 0.8][r % 4],
                        // a near-uniform row: past the 32nd step of warp 15's segment
                        random: if r % 7 == 6 && vocab > 32_768 {
                            (15.97 / 32.0 * 2f64.powi(64)) as u64
                        } else {
                            (rng.below(1 << 30) as u64) << 34 | rng.below(1 << 30) as u64
                        },
                        filter: if filtered {
                            filters[(r / 2) % 5]
                        } else {
                            Filter::NONE
                        },
                    },
                })
                .collect();
            let words = mlaserve_cuda::executor::draw_words(&draws);
            // none when every row is greedy: the kernel then reads no draws
            let dd = (!words.is_empty()).then(|| gpu.upload(&words).unwrap());
            let out = poisoned::<u32>(gpu, rows * 5);
            let at = |k: usize| out.ptr() + 4 * k as u64;
            let draws_at = dd.as_ref().map_or(0, |d| d.ptr());
            gpu.logits_pick_in(c, rows, xd.ptr(), vocab, draws_at, at(0), at(rows * 4))
                .unwrap();
            let w = gpu.to_host(&out).unwrap();
            let differ = (0..rows)
                .filter(|&r| {
                    let want = RowPick::of(&x[r * vocab..][..vocab], draws[r]);
                    let a = want.argmax;
                    let bad = a.first_bad.map_or((u32::MAX, 0), |(i, v)| (i, v.to_bits()));
                    w[r * 4..][..4] != [a.token_id, a.max.to_bits(), bad.0, bad.1]
                        || w[rows * 4 + r] != want.token_id
                })
                .count();
            rep.check(
                "logits_pick",
                format!(
                    "rows{rows} V{vocab} {}{}",
                    match (drawn, filtered) {
                        (false, _) => "greedy",
                        (true, false) => "drawn",
                        (true, true) => "drawn, filtered",
                    },
                    cluster_label(c)
                ),
                "f32>u32",
                differ as f64,
                0.0,
            );
        }
    }
    logits_pick_random_filters(gpu, rng, rep);
}

/// Every row drawn under random filters (`logits_pick`'s radix selects and cuts): top-k from
/// 1 to past the row's kept count, top-p from 1e-30 to just under 1, min-p up to 1, any
/// combination, at temperatures 0.05-5, on rows of odd and small vocabularies too, plain
/// random, bf16-rounded (many ties), all equal, or mostly masked. The error is the number of
/// rows whose drawn token differs from `RowPick::of`'s.
fn logits_pick_random_filters(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_model::{Filter, RowDraw, RowPick};
    for &(rows, vocab) in &[
        (64, 7),
        (64, 33),
        (64, 1_001),
        (32, 4_099),
        (32, 32_000),
        (16, 102_400),
    ] {
        let mut x = vec![0f32; rows * vocab];
        for r in 0..rows {
            let row = &mut x[r * vocab..][..vocab];
            let scale = [0.1f32, 1.0, 4.0, 16.0][r % 4];
            for v in row.iter_mut() {
                *v = rng.f() * scale;
            }
            match (r / 4) % 4 {
                1 => row.iter_mut().for_each(|v| *v = unbf(bf(*v))), // ties
                2 if r % 8 == 0 => row.fill(0.5),                    // all equal
                3 => {
                    for v in row.iter_mut() {
                        if rng.below(4) != 0 {
                            *v = f32::NEG_INFINITY; // mostly masked
                        }
                    }
                    row[rng.below(vocab)] = 1.0; // one kept at least
                }
                _ => {}
            }
        }
        let draws: Vec<RowDraw> = (0..rows)
            .map(|_| {
                let top_k = match rng.below(4) {
                    0 => 0,
                    1 => 1 + rng.below(4) as u32,
                    2 => 1 + rng.below(vocab + 8) as u32,
                    _ => 1 + rng.below(64) as u32,
                };
                let top_p = match rng.below(5) {
                    0 | 1 => 1.0,
                    2 => 1e-30,
                    3 => 0.99999994,
                    _ => 0.05 + 0.9 * (rng.f() * 0.5 + 0.5),
                };
                let min_p = match rng.below(5) {
                    0 | 1 => 0.0,
                    2 => 1.0,
                    _ => 0.3 * (rng.f() * 0.5 + 0.5),
                };
                RowDraw::Softmax {
                    inv_temperature: [1.0f32, 20.0, 0.2, 1.3][rng.below(4)],
                    random: rng.next_u64(),
                    filter: Filter {
                        top_k,
                        top_p,
                        min_p,
                    },
                }
            })
            .collect();
        let want: Vec<u32> = (0..rows)
            .map(|r| RowPick::of(&x[r * vocab..][..vocab], draws[r]).token_id)
            .collect();
        let words = mlaserve_cuda::executor::draw_words(&draws);
        let dd = gpu.upload(&words).unwrap();
        for c in pick_clusters(gpu) {
            let xd = gpu.upload(&x).unwrap(); // filtered draws overwrite their rows
            let out = poisoned::<u32>(gpu, rows * 5);
            let at = |k: usize| out.ptr() + 4 * k as u64;
            gpu.logits_pick_in(c, rows, xd.ptr(), vocab, dd.ptr(), at(0), at(rows * 4))
                .unwrap();
            let w = gpu.to_host(&out).unwrap();
            let differ = (0..rows).filter(|&r| w[rows * 4 + r] != want[r]).count();
            rep.check(
                "logits_pick",
                format!("rows{rows} V{vocab} random filters{}", cluster_label(c)),
                "f32>u32",
                differ as f64,
                0.0,
            );
        }
    }
}

/// The blocks a row `logits_pick` runs at in the op table: 1, and clusters of 2 and 8 (odd
/// segments, empty ones at small vocabularies) where they fit on this GPU.
fn pick_clusters(gpu: &Gpu) -> Vec<u32> {
    [1, 2, 8]
        .into_iter()
        .filter(|&c| c == 1 || gpu.clusters_fit("logits_pick", c, 1024))
        .collect()
}

fn cluster_label(c: u32) -> String {
    if c == 1 {
        String::new()
    } else {
        format!(", clusters of {c}")
    }
}
