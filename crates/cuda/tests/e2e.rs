//! The whole model on the GPU against the CPU executor, on every fixture file: logits on
//! every path (prefill, decode-only, chunked prefill over cached context, forced absorbed),
//! greedy continuations, and the engine's continuous batching on the GPU.
//!
//! Row error: max|gpu - cpu| / max|cpu| of one position's logits. The GPU rounds every GEMM
//! input to bf16 and keeps a bf16 latent cache; the CPU keeps f32 activations for F32
//! weights (Q8_0 activations for Q8_0 files) and an f32 cache. That noise (~1e-2) alone can
//! flip a discrete decision of these random-weight fixtures — a sigmoid-routing near-tie or a
//! DSA top-k near-tie — and a flipped decision moves a row by 0.1-1 (measured on the H200:
//! bench/cuda/e2e-report.json). So the bounds are statistical, per file over all prompts and
//! paths: median row error and argmax agreement (`Bound`). A wrong layout, scale or kernel
//! moves every row by O(1) and fails them by far. Greedy continuations must be equal up to
//! the first step where the CPU's own top-2 gap is within the noise (`DECISIVE_GAP`).
//! On a host without CUDA every test prints why and passes without running.

use mlaserve_cuda::CudaExecutor;
use mlaserve_engine::{start_engine_with, EngineConfig, GenerateRequest, SamplingParams};
use mlaserve_model::score::{greedy_on, score_on};
use mlaserve_model::{AttentionPath, CpuExecutor, Executor, LoadOptions, Model};
use mlaserve_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

const MODELS: [&str; 3] = ["deepseek_v2", "deepseek_v3", "glm_moe_dsa"];

fn dir(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(model)
}

/// Statistical bound of one file: median row error and share of rows whose argmax agrees.
#[derive(Clone, Copy, Debug)]
struct Bound {
    median: f64,
    agree: f64,
}

const BOUND_F32: Bound = Bound {
    median: 2e-2,
    agree: 0.9,
};
const BOUND_BF16: Bound = Bound {
    median: 2e-2,
    agree: 0.9,
};
const BOUND_QUANT: Bound = Bound {
    median: 5e-2,
    agree: 0.85,
};
/// GLM-DSA's Q4_K_M file: the CPU's own rounding decides near-ties here. Its agreement was
/// 0.886 (session 13), 0.859 (27) and 0.845 (34) as either side's rounding changed: in session
/// 34 the GPU's logits did not move, the CPU's did — f4dd545 defined a Q4_K row as the scalar
/// vec_dot's sums, which flipped 3 of the 220 reference rows' argmax (a routing or top-k
/// near-tie: each row moved by 0.17) and nothing else (bench/cuda/v2lite.md, session 35). A
/// wrong kernel agrees on ~1 row in 512 and fails the median bound by far.
const BOUND_Q4K: Bound = Bound {
    median: 5e-2,
    agree: 0.8,
};

/// A CPU greedy step is decisive when its top-2 logit gap is at least this share of max|logit|.
const DECISIVE_GAP: f32 = 0.05;

/// Every fixture file with its bound.
fn files() -> Vec<(&'static str, String, Bound)> {
    let mut v = Vec::new();
    for m in MODELS {
        v.push((m, format!("{m}-f32.gguf"), BOUND_F32));
        v.push((m, format!("{m}-bf16.gguf"), BOUND_BF16));
        v.push((m, format!("{m}-q8_0.gguf"), BOUND_QUANT));
        v.push((m, "hf".to_string(), BOUND_F32));
    }
    v.push((
        "deepseek_v3",
        "deepseek_v3-legacy-f32.gguf".into(),
        BOUND_F32,
    ));
    v.push(("glm_moe_dsa", "glm_moe_dsa-q4_k_m.gguf".into(), BOUND_Q4K));
    v
}

fn prompts(model: &str) -> Vec<(String, Vec<u32>)> {
    let text = std::fs::read_to_string(dir(model).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["prompts"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, ids)| {
            let ids = ids
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            (k.clone(), ids)
        })
        .collect()
}

fn load(model: &str, file: &str) -> Arc<Model> {
    let p = dir(model).join(file);
    Arc::new(
        Model::load(&p, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
}

/// The CUDA executor, or None (with the reason printed) where there is no GPU.
fn cuda(model: Arc<Model>, test: &str) -> Option<CudaExecutor> {
    match CudaExecutor::new(model, 0) {
        Ok(e) => Some(e),
        Err(e @ mlaserve_cuda::CudaError::Unavailable(_)) => {
            println!("SKIPPED {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

fn row_errors(got: &[f32], want: &[f32], vocab: usize) -> Vec<f64> {
    assert_eq!(got.len(), want.len());
    got.chunks(vocab)
        .zip(want.chunks(vocab))
        .map(|(g, w)| {
            let den = w.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
            let num = g.iter().zip(w).fold(0f64, |m, (&a, &b)| {
                if a.is_nan() {
                    f64::NAN
                } else {
                    m.max((a as f64 - b as f64).abs())
                }
            });
            num / den.max(1e-30)
        })
        .collect()
}

#[test]
fn logits_match_cpu_on_every_fixture_and_path() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (model, file, bound) in files() {
        let m = load(model, &file);
        let Some(mut gpu) = cuda(m.clone(), "logits_match_cpu_on_every_fixture_and_path") else {
            return;
        };
        let mut cpu = CpuExecutor::new(m.clone());
        let vocab = m.config().vocab_size;
        let (mut errs, mut agree) = (Vec::new(), 0usize);
        for (name, ids) in prompts(model) {
            for (path, chunk) in [
                (AttentionPath::Auto, 0),
                (AttentionPath::Auto, 1),
                (AttentionPath::Auto, 5),
                (AttentionPath::Mqa, 0),
                (AttentionPath::Mha, 0),
            ] {
                let want = score_on(&mut cpu, &ids, path, chunk).unwrap();
                let got = score_on(&mut gpu, &ids, path, chunk).unwrap();
                let e = row_errors(&got, &want, vocab);
                let worst = e.iter().copied().fold(0f64, f64::max);
                println!("{model}/{file} {name} {path:?} chunk {chunk}: max row err {worst:.3e}");
                errs.extend(e);
                agree += got
                    .chunks(vocab)
                    .zip(want.chunks(vocab))
                    .filter(|(g, w)| argmax(g) == argmax(w))
                    .count();
            }
        }
        let n = errs.len();
        let nan = errs.iter().any(|e| e.is_nan());
        errs.sort_by(|a, b| a.total_cmp(b));
        let median = errs[n / 2];
        let share = agree as f64 / n as f64;
        let ok = !nan && median <= bound.median && share >= bound.agree;
        println!(
            "{model}/{file}: {n} rows, median row err {median:.3e} (<= {:.0e}), p90 {:.3e}, max {:.3e}, argmax agree {share:.3} (>= {}){}",
            bound.median, errs[n * 9 / 10], errs[n - 1], bound.agree, if ok { "" } else { "  FAIL" }
        );
        report.push(serde_json::json!({"file": format!("{model}/{file}"), "rows": n, "median_row_rel_err": median, "p90": errs[n * 9 / 10], "max": errs[n - 1], "argmax_agree": share, "bound_median": bound.median, "bound_agree": bound.agree, "nan": nan, "pass": ok}));
        if !ok {
            failures.push(format!("{model}/{file}"));
        }
    }
    if let Ok(p) = std::env::var("MLASERVE_E2E_REPORT") {
        std::fs::write(p, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    }
    assert!(failures.is_empty(), "past the bound: {failures:#?}");
}

fn argmax(x: &[f32]) -> u32 {
    mlaserve_model::score::argmax(x)
}

/// Top-2 gap of a logits row over its max |logit|.
fn rel_gap(x: &[f32]) -> f32 {
    let a = argmax(x) as usize;
    let second = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != a)
        .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
    let scale = x.iter().fold(0f32, |m, &v| m.max(v.abs())).max(1e-30);
    (x[a] - second) / scale
}

#[test]
fn greedy_equals_cpu_for_f32_and_bf16_files() {
    let mut failures = Vec::new();
    for model in MODELS {
        for file in [format!("{model}-f32.gguf"), format!("{model}-bf16.gguf")] {
            let m = load(model, &file);
            let Some(mut gpu) = cuda(m.clone(), "greedy_equals_cpu_for_f32_and_bf16_files") else {
                return;
            };
            let mut cpu = CpuExecutor::new(m.clone());
            let vocab = m.config().vocab_size;
            for (name, ids) in prompts(model) {
                let want = greedy_on(&mut cpu, &ids, 16, AttentionPath::Auto).unwrap();
                let got = greedy_on(&mut gpu, &ids, 16, AttentionPath::Auto).unwrap();
                // The CPU's decision margins along its own continuation.
                let mut seq = ids.clone();
                seq.extend(&want[..15]);
                let logits = score_on(&mut cpu, &seq, AttentionPath::Auto, 0).unwrap();
                let decisive = (0..16)
                    .take_while(|&i| {
                        rel_gap(&logits[(ids.len() - 1 + i) * vocab..][..vocab]) >= DECISIVE_GAP
                    })
                    .count();
                let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
                println!("{model}/{file} {name}: {same}/16 greedy tokens equal, the first {decisive} decisive on the CPU");
                if same < decisive {
                    failures.push(format!(
                        "{model}/{file} {name}: gpu {got:?} cpu {want:?}, {decisive} decisive"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Continuous batching on the GPU: prompts of mixed lengths submitted together (prefill
/// chunks and decodes share steps) give each the ids it gets alone.
#[test]
fn engine_on_gpu_batches_like_alone() {
    for model in MODELS {
        let path = dir(model).join(format!("{model}-bf16.gguf"));
        let m = Arc::new(Model::load(&path, &LoadOptions::default()).unwrap());
        let tok = Arc::new(Tokenizer::from_gguf(m.gguf().unwrap()).unwrap());
        let Some(gpu) = cuda(m.clone(), "engine_on_gpu_batches_like_alone") else {
            return;
        };
        let mut alone = cuda(m.clone(), "engine_on_gpu_batches_like_alone").unwrap();
        let cfg = EngineConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 16,
            block_size: 4,
            num_blocks: Some(256),
            max_model_len: Some(256),
            enable_prefix_caching: true,
            seed: Some(0),
            ..EngineConfig::default()
        };
        let handle = start_engine_with(Box::new(gpu), tok, cfg).unwrap();
        let ps: Vec<Vec<u32>> = prompts(model).into_iter().map(|(_, ids)| ids).collect();
        let reqs = ps
            .iter()
            .map(|p| GenerateRequest {
                prompt_tokens: p.clone(),
                params: SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(12)
                },
            })
            .collect();
        let outs = handle.generate_blocking(reqs);
        for (p, out) in ps.iter().zip(outs) {
            let got = out.unwrap().token_ids;
            let want = greedy_on(&mut alone, p, 12, AttentionPath::Auto).unwrap();
            assert_eq!(got, want, "{model}: prompt of {} tokens", p.len());
        }
        handle.shutdown();
        println!("{model}: engine on {} matches lone greedy", alone.device());
    }
}

/// The GPU fires the same named probes as the CPU (so `--trace`, `--dump` and an HF
/// reference work on `--device cuda`), with the same shapes and values within bf16 noise.
#[test]
fn gpu_probes_match_cpu_probes() {
    use mlaserve_model::probe;
    let m = load("glm_moe_dsa", "glm_moe_dsa-bf16.gguf");
    let Some(mut gpu) = cuda(m.clone(), "gpu_probes_match_cpu_probes") else {
        return;
    };
    let mut cpu = CpuExecutor::new(m.clone());
    let ids: Vec<u32> = (0..13).map(|i| (i * 31 + 7) % 500).collect();
    let run = |e: &mut dyn Executor| {
        probe::start_capture("*");
        score_on(e, &ids, AttentionPath::Auto, 0).unwrap();
        probe::take_capture()
    };
    let (c, g) = (run(&mut cpu), run(&mut gpu));
    let names = [
        "L0.attn_norm",
        "L0.mla.kv_c_normed",
        "L0.mla.k_pe",
        "L0.mla.attn_out",
        "L0.out",
        "L2.out",
        "logits",
    ];
    for name in names {
        let find = |rs: &[probe::Record]| rs.iter().find(|r| r.name == name).cloned();
        let (a, b) = (find(&c), find(&g));
        let (a, b) = (
            a.unwrap_or_else(|| panic!("cpu has no {name}")),
            b.unwrap_or_else(|| panic!("gpu has no {name}")),
        );
        assert_eq!(a.shape, b.shape, "{name}");
        assert_eq!(a.path, b.path, "{name}");
        let err = row_errors(&b.data, &a.data, a.data.len())[0];
        println!("{name}: shape {:?}, rel err {err:.3e}", a.shape);
        assert!(err <= 3e-2, "{name}: rel err {err:.3e}");
    }
}
