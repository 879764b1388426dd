//! Kernel lab: `logits_pick` (the token each logits row's draw chooses, on the GPU) by draw
//! kind — greedy, a draw at temperature 1, and draws with top-k 50, top-p 0.95, min-p 0.05 and
//! top-k 50 with top-p 0.95 — at 1 and 64 rows of V2's 102,400 logits, on peaked and flat rows
//! (logits uniform in [-16, 16) and in [-4, 4)). A filtered draw overwrites its row with its
//! probabilities, so every call reads a fresh copy of the logits (cold in L2: an upper bound
//! on the step's cost, whose LM head has just written them). Each pick is checked against
//! `RowPick::of` on the host first. Timing: CUDA events around batches of back-to-back calls,
//! median of 7 batches of 8 (common::time_us).
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example logits_pick [--warm]
//! ```
//!
//! `--warm`: compile the kernels (into `MLASERVE_KERNEL_CACHE`) and exit, so that variants
//! under `MLASERVE_KERNEL_DEFINES` (the `PICK_LAB_*` defines of `pick.cu`: picks
//! reported WRONG, timing only) compile side by side before they are timed one at a time.

#[path = "common/mod.rs"]
mod common;

use common::{random_f32, time_us};
use mlaserve_cuda::Gpu;
use mlaserve_model::{Filter, RowDraw, RowPick};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const VOCAB: usize = 102_400;
const CALLS: usize = 2 + 7 * 8;

fn main() -> Res<()> {
    let gpu = Gpu::new(0)?;
    if std::env::args().any(|a| a == "--warm") {
        return Ok(());
    }
    let kinds: [(&str, Option<Filter>); 7] = [
        ("greedy", None),
        ("T=1", Some(Filter::NONE)),
        (
            "top-k 50",
            Some(Filter {
                top_k: 50,
                ..Filter::NONE
            }),
        ),
        (
            "top-p 0.95",
            Some(Filter {
                top_p: 0.95,
                ..Filter::NONE
            }),
        ),
        (
            "min-p 0.05",
            Some(Filter {
                min_p: 0.05,
                ..Filter::NONE
            }),
        ),
        (
            "top-k 50 + top-p 0.95",
            Some(Filter {
                top_k: 50,
                top_p: 0.95,
                ..Filter::NONE
            }),
        ),
        (
            "top-p 0.5",
            Some(Filter {
                top_p: 0.5,
                ..Filter::NONE
            }),
        ),
    ];
    println!("| rows | logits | draw | µs a call |");
    println!("|---:|---|---|---:|");
    for rows in [1usize, 64] {
        for (scale_name, scale) in [("peaked (x4)", 4.0f32), ("flat (x1)", 1.0)] {
            // random_f32 is uniform-ish bf16 noise in [-1, 1]: scaled into logits
            let x: Vec<f32> = random_f32(rows * VOCAB, rows as u64)
                .iter()
                .map(|v| v * scale * 4.0)
                .collect();
            let copies: Vec<_> = (0..CALLS)
                .map(|_| gpu.upload(&x))
                .collect::<Result<_, _>>()?;
            let out = gpu.alloc::<u32>(rows * 5)?;
            for (name, filter) in kinds {
                let draws: Vec<RowDraw> = (0..rows)
                    .map(|r| match filter {
                        None => RowDraw::Argmax,
                        Some(filter) => RowDraw::Softmax {
                            inv_temperature: 1.0,
                            random: (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                            filter,
                        },
                    })
                    .collect();
                let words = mlaserve_cuda::executor::draw_words(&draws);
                let dd = (!words.is_empty())
                    .then(|| gpu.upload(&words))
                    .transpose()?;
                let draws_at = dd.as_ref().map_or(0, |d| d.ptr());
                let run = |i: usize| {
                    gpu.logits_pick(
                        rows,
                        copies[i % CALLS].ptr(),
                        VOCAB,
                        draws_at,
                        out.ptr(),
                        out.ptr() + 4 * 4 * rows as u64,
                    )
                };
                // checked first, on a copy no call has overwritten yet (the last one)
                run(CALLS - 1)?;
                let w = gpu.to_host(&out)?;
                let wrong = (0..rows)
                    .filter(|&r| {
                        w[rows * 4 + r] != RowPick::of(&x[r * VOCAB..][..VOCAB], draws[r]).token_id
                    })
                    .count();
                // restore the checked copy, then time
                gpu.write(&copies[CALLS - 1], 0, &x)?;
                let us = time_us(&gpu, &run, 2, 7, 8)?;
                let note = if wrong > 0 {
                    format!(" ({wrong} rows WRONG)")
                } else {
                    String::new()
                };
                println!("| {rows} | {scale_name} | {name} | {us:.1}{note} |");
                // restore every copy for the next kind
                for c in &copies {
                    gpu.write(c, 0, &x)?;
                }
            }
        }
    }
    Ok(())
}
