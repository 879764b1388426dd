//! CUDA graphs replay decode steps exactly: the same decode steps with graphs on and off give
//! bit-identical logits — across batch sizes 6 to 1 (MoE on the grouped GEMM and on the
//! GEMV) and context lengths that cross a split-count boundary of the absorbed kernel
//! (256 keys) — and with a cache replaced between runs (init_cache drops the graphs). GLM-5's
//! decode steps are captured while every position is inside the DSA indexer's dense window
//! and stay eager past it (its top-k runs on the host). On a host without CUDA the test
//! prints why and passes.
//!
//! Steps picked on the device (`forward_picks`, greedy and drawn, graphed and eager) hand
//! back each row's `RowPick::of` its logits, bit for bit.

use mlaserve_cuda::CudaExecutor;
use mlaserve_model::score::argmax;
use mlaserve_model::{
    AttentionPath, Executor, Filter, ForwardBatch, LoadOptions, LogitsWanted, Model, RowDraw,
    RowPick, SeqInput,
};
use std::path::PathBuf;
use std::sync::Arc;

const BS: usize = 4;

fn load(model: &str) -> Arc<Model> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(model)
        .join(format!("{model}-bf16.gguf"));
    Arc::new(Model::load(&p, &LoadOptions::default()).unwrap())
}

/// Prefills `prompts` together, then decodes greedily; sequence i stops after `steps[i]`
/// decode steps. Returns every step's logits.
fn run(exec: &mut CudaExecutor, prompts: &[Vec<u32>], steps: &[usize]) -> Vec<Vec<f32>> {
    let vocab = exec.config().vocab_size;
    run_with(exec, prompts, steps, |exec, batch| {
        let logits = exec.forward(batch).unwrap();
        let next = logits.chunks_exact(vocab).map(argmax).collect();
        (logits, next)
    })
}

/// [`run`] with each step's forward pass and next tokens from `forward`.
fn run_with<T>(
    exec: &mut CudaExecutor,
    prompts: &[Vec<u32>],
    steps: &[usize],
    mut forward: impl FnMut(&mut CudaExecutor, &ForwardBatch) -> (T, Vec<u32>),
) -> Vec<T> {
    let per =
        (prompts.iter().map(Vec::len).max().unwrap() + steps.iter().max().unwrap()).div_ceil(BS);
    exec.init_cache(per * prompts.len(), BS).unwrap();
    let table = |i: usize| ((i * per) as u32..((i + 1) * per) as u32).collect::<Vec<u32>>();
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    let mut ctx = vec![0usize; prompts.len()];
    let mut out = Vec::new();
    for step in 0..=*steps.iter().max().unwrap() {
        let live: Vec<usize> = (0..prompts.len()).filter(|&i| step <= steps[i]).collect();
        // Each sequence's block table holds just the blocks it needs so far, so it grows
        // while decoding (a graph's table buffer is outgrown and the shape captured again).
        let seqs = live
            .iter()
            .map(|&i| SeqInput {
                tokens: next[i].clone(),
                context_len: ctx[i],
                block_table: table(i)[..(ctx[i] + next[i].len()).div_ceil(BS)].to_vec(),
                logits: LogitsWanted::Last,
            })
            .collect();
        let batch = ForwardBatch::new(seqs, BS, AttentionPath::Auto).unwrap();
        let (step_out, tokens) = forward(exec, &batch);
        for (row, &i) in live.iter().enumerate() {
            ctx[i] += next[i].len();
            next[i] = vec![tokens[row]];
        }
        out.push(step_out);
    }
    out
}

#[test]
fn decode_graphs_replay_eager_steps_exactly() {
    for model in ["deepseek_v2", "deepseek_v3", "glm_moe_dsa"] {
        let m = load(model);
        let mut graphed = match CudaExecutor::new(m.clone(), 0) {
            Ok(e) => e,
            Err(e @ mlaserve_cuda::CudaError::Unavailable(_)) => {
                println!("SKIPPED decode_graphs_replay_eager_steps_exactly: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        graphed.set_cuda_graphs(true);
        let mut eager = CudaExecutor::new(m.clone(), 0).unwrap();
        eager.set_cuda_graphs(false);
        // 250 tokens: the long sequence crosses 256 keys while decoding.
        let long: Vec<u32> = (0..250).map(|i| (i * 7 % 50 + 3) as u32).collect();
        let prompts = vec![
            long,
            vec![5, 9, 11],
            vec![17, 4, 8, 21, 6, 2, 30],
            vec![12, 40],
            vec![33, 7, 19, 2, 8],
            vec![3, 3, 9, 27],
        ];
        // Batches of 6 and 5 tokens take the grouped expert GEMM, 4 and fewer the GEMV.
        let steps = [24, 14, 6, 3, 2, 4];
        // Short sequences: every position stays inside GLM's dense DSA window (index_topk 8
        // in the fixture), where its decode steps have no host top-k and are captured too.
        let short = vec![vec![5, 9], vec![17, 4, 8]];
        let short_steps = [4, 3];
        let dsa = model == "glm_moe_dsa";
        // One sequence whose block table grows from 1 to 11 blocks of 4: past the 4 blocks
        // its graph was captured with, the shape is captured again. (GLM: graphed while its
        // positions are inside the DSA window, steps 1-6.)
        let grow = vec![vec![5, 9]];
        type Scenario<'a> = (&'a [Vec<u32>], &'a [usize], usize); // prompts, steps, graphs
        let scenarios: [Scenario; 4] = [
            // Batches of 6, 5, 4, 3 below 256 keys, then (2, 2 splits) and (1, 2 splits);
            // GLM: positions past its DSA window, so nothing is captured.
            (&prompts, &steps, if dsa { 0 } else { 6 }),
            (&short, &short_steps, 2),
            (&grow, &[40], 1),
            // Again after init_cache dropped the graphs.
            (&prompts, &steps, if dsa { 0 } else { 6 }),
        ];
        for (round, (ps, st, want_graphs)) in scenarios.into_iter().enumerate() {
            let want = run(&mut eager, ps, st);
            let got = run(&mut graphed, ps, st);
            assert_eq!(got.len(), want.len());
            for (s, (g, w)) in got.iter().zip(&want).enumerate() {
                let diff = g.iter().zip(w).fold(0f32, |d, (a, b)| {
                    if a == b {
                        d
                    } else {
                        d.max((a - b).abs()).max(f32::MIN_POSITIVE)
                    }
                });
                assert!(
                    g.len() == w.len() && diff == 0.0,
                    "{model} round {round} step {s}: graph logits differ from eager by {diff}"
                );
            }
            println!(
                "{model} round {round}: {} steps bit-identical, {} decode graphs kept",
                got.len(),
                graphed.cuda_graphs()
            );
            if want_graphs == 0 {
                assert_eq!(
                    graphed.cuda_graphs(),
                    0,
                    "{model}: DSA top-k steps stay eager"
                );
            } else {
                assert!(
                    graphed.cuda_graphs() >= want_graphs,
                    "{model} round {round}: {} graphs, want >= {want_graphs}",
                    graphed.cuda_graphs()
                );
            }
        }
    }
}

/// Steps picked on the device (`forward_picks`: decode steps from their graphs, prefills and
/// DSA top-k steps eager; greedy rows, rows drawn at a temperature and rows handed back
/// whole) hand back `RowPick::of` each logits row of the same steps run whole, and the whole
/// rows themselves, bit for bit. The next tokens are the argmaxes, so both runs see the same
/// steps.
#[test]
fn device_picks_are_the_picks_of_the_logits() {
    for model in ["deepseek_v2", "glm_moe_dsa"] {
        let m = load(model);
        let mut whole = match CudaExecutor::new(m.clone(), 0) {
            Ok(e) => e,
            Err(e @ mlaserve_cuda::CudaError::Unavailable(_)) => {
                println!("SKIPPED device_picks_are_the_picks_of_the_logits: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut reduced = CudaExecutor::new(m.clone(), 0).unwrap();
        let vocab = whole.config().vocab_size;
        let long: Vec<u32> = (0..40).map(|i| (i * 7 % 50 + 3) as u32).collect();
        let prompts = vec![long, vec![5, 9, 11], vec![17, 4], vec![3]];
        let steps = [12, 6, 9, 3];
        // row r of step s: greedy every third row, else a draw at one of three temperatures,
        // every other one with top-k 20 and top-p 0.9; in odd steps rows 0, 1 and 3 handed
        // back whole instead (two runs of them: picked on the device by
        // default, the step's rows all on the host with MLASERVE_PICK_WHOLE_ROWS=0)
        let draws = |s: usize, rows: usize| -> Vec<RowDraw> {
            (0..rows)
                .map(|r| match (s + r) % 3 {
                    _ if s % 2 == 1 && r % 3 != 2 => RowDraw::Whole,
                    0 => RowDraw::Argmax,
                    k => RowDraw::Softmax {
                        inv_temperature: [1.0, 0.7, 2.0][(s + k) % 3],
                        random: ((s * 31 + r) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        filter: match (s + r) % 2 {
                            0 => Filter::NONE,
                            _ => Filter {
                                top_k: 20,
                                top_p: 0.9,
                                min_p: 0.0,
                            },
                        },
                    },
                })
                .collect()
        };
        let mut n = 0;
        let want = run_with(&mut whole, &prompts, &steps, |exec, batch| {
            let logits = exec.forward(batch).unwrap();
            let d = draws(n, logits.len() / vocab);
            n += 1;
            let rows: Vec<RowPick> = logits
                .chunks_exact(vocab)
                .zip(&d)
                .map(|(r, &d)| RowPick::of(r, d))
                .collect();
            let whole_rows: Vec<u32> = logits
                .chunks_exact(vocab)
                .zip(&d)
                .filter(|(_, &d)| d == RowDraw::Whole)
                .flat_map(|(r, _)| r.iter().map(|v| v.to_bits()))
                .collect();
            let next = rows.iter().map(|r| r.argmax.token_id).collect();
            ((rows, whole_rows), next)
        });
        let (mut buf, mut whole_buf, mut n) = (Vec::new(), Vec::new(), 0);
        let got = run_with(&mut reduced, &prompts, &steps, |exec, batch| {
            let d = draws(n, batch.logits_indices().len());
            n += 1;
            exec.forward_picks(batch, &d, &mut buf, &mut whole_buf)
                .unwrap();
            let next = buf.iter().map(|r| r.argmax.token_id).collect();
            let whole_rows: Vec<u32> = whole_buf.iter().map(|v| v.to_bits()).collect();
            ((buf.clone(), whole_rows), next)
        });
        assert_eq!(got.len(), want.len());
        let mut n_whole = 0;
        for (s, ((g, gw), (w, ww))) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{model} step {s}");
            assert!(gw == ww, "{model} step {s}: the whole rows differ");
            n_whole += ww.len() / vocab;
            for (row, (p, q)) in g.iter().zip(w).enumerate() {
                let (a, b) = (p.argmax, q.argmax);
                assert!(
                    p.token_id == q.token_id
                        && a.token_id == b.token_id
                        && a.max.to_bits() == b.max.to_bits()
                        && a.first_bad.map(|(i, v)| (i, v.to_bits()))
                            == b.first_bad.map(|(i, v)| (i, v.to_bits())),
                    "{model} step {s} row {row}: device {p:?}, from the logits {q:?}"
                );
            }
        }
        assert!(n_whole > 0, "{model}: no row was handed back whole");
        println!(
            "{model}: {} steps picked on the device as on the host, {} decode graphs kept",
            got.len(),
            reduced.cuda_graphs()
        );
        if model == "deepseek_v2" {
            assert!(reduced.cuda_graphs() > 0, "{model}: no step was graphed");
        }
    }
}
