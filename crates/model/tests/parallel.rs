//! Tensor and expert parallelism on CPU: `TpExecutor` at TP=2 and TP=4 (heads, dense MLP and
//! every expert sliced; or whole experts per rank) against the plain `CpuExecutor`, on every
//! fixture file, over full prefill, chunked prefill over cached context, and decode; plus load
//! errors, shard contents, and ranks that fail, panic or stall.
//!
//! Bound for f32 arithmetic: max |Δlogit| per row <= 1e-5 x max |logit| of the row. Sharding
//! only regroups f32 sums (per rank over its heads / intermediate slice, then over ranks in
//! rank order); measured differences are <= 7e-7 on every fixture.
//!
//! Quantized files run two ways. Loaded with `dequantize` (f32 arithmetic on the stored
//! weights, the slices cut from the quantized blocks before dequantizing, aligned or not),
//! the same 1e-5 bound holds. On the quantized kernels, activations are rounded to the weight's
//! vec-dot type (bf16, Q8_0 blocks), which turns a last-bit change of a sum into a rounding
//! step now and then, and a column slice off the block grid runs in f32 (no activation
//! rounding there): differences reach ~2e-2 on the DeepSeek Q8_0 fixtures (bound 5e-2, greedy
//! identical), while GLM's DSA top-k flips on such changes, so its quantized files are only
//! checked through `dequantize`.

mod common;
use common::*;
use mlaserve_gguf::GgmlType;
use mlaserve_model::parallel::{CommError, Fault, RankPools, ThreadComm};
use mlaserve_model::score::{greedy_on, score_on};
use mlaserve_model::weights::Ffn;
use mlaserve_model::{
    AttentionPath, CpuExecutor, Executor, LoadOptions, Model, ModelError, Shard, TpExecutor,
    TpOptions,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every fixture file of `model`: its GGUFs and its HF directory.
fn files(model: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(fixture_dir(model))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".gguf") || n == "hf")
        .collect();
    v.sort();
    assert!(v.len() >= 4, "{model}: {v:?}");
    v
}

fn is_f32(file: &str) -> bool {
    file == "hf" || file.ends_with("f32.gguf")
}

fn tp(world: usize, expert_parallel: bool) -> TpOptions {
    TpOptions {
        expert_parallel,
        ..TpOptions::new(world)
    }
}

/// (chunk, label): full prefill, chunked prefill over cached context, one token at a time.
const CHUNKS: &[(usize, &str)] = &[(0, "prefill"), (5, "chunk5"), (1, "decode")];

/// Logits of `ids` for each of [`CHUNKS`], and the greedy continuation of `ids[..13]`.
fn run(exec: &mut dyn Executor, ids: &[u32]) -> (Vec<Vec<f32>>, Vec<u32>) {
    let logits = CHUNKS
        .iter()
        .map(|&(c, _)| score_on(exec, ids, AttentionPath::Auto, c).unwrap())
        .collect();
    let greedy = greedy_on(exec, &ids[..13], 8, AttentionPath::Auto).unwrap();
    (logits, greedy)
}

/// TP=1 (the plain executor) against TP=2, TP=4, EP=2 and EP=4 on one file.
fn check_file(model: &str, file: &str, opts: &LoadOptions, bound: f32) {
    let path = fixture_dir(model).join(file);
    // The reference's longest prompt + its continuation: longer than GLM's index_topk.
    let ids = Reference::load(model).input("f32", "len24");
    let mut base = CpuExecutor::new(Arc::new(Model::load(&path, opts).unwrap()));
    let vocab = base.config().vocab_size;
    let (want, want_greedy) = run(&mut base, &ids);
    // One rank is the plain forward pass, bit for bit.
    let mut one = TpExecutor::load(&path, opts, tp(1, false)).unwrap();
    assert_eq!(
        run(&mut one, &ids),
        (want.clone(), want_greedy.clone()),
        "{file} tp=1"
    );
    for (world, ep) in [(2, false), (4, false), (2, true), (4, true)] {
        let label = format!(
            "{model}/{file} tp={world} ep={ep} dequantize={}",
            opts.dequantize
        );
        let mut ex = TpExecutor::load(&path, opts, tp(world, ep)).unwrap();
        assert_eq!(
            ex.device(),
            format!("cpu tp={world}{}", if ep { " ep" } else { "" })
        );
        let (got, greedy) = run(&mut ex, &ids);
        for ((g, w), (_, what)) in got.iter().zip(&want).zip(CHUNKS) {
            let err = max_rel_err(g, w, vocab);
            assert!(
                err <= bound,
                "{label} {what}: max rel err {err:.3e} > {bound:.0e}"
            );
        }
        assert_eq!(greedy, want_greedy, "{label}: greedy continuation");
    }
}

#[test]
fn deepseek_v2_every_file_tp_and_ep_match_tp1() {
    check_every_file("deepseek_v2");
}

#[test]
fn deepseek_v3_every_file_tp_and_ep_match_tp1() {
    check_every_file("deepseek_v3");
}

#[test]
fn glm_moe_dsa_every_file_tp_and_ep_match_tp1() {
    check_every_file("glm_moe_dsa");
}

/// f32 files as they are, quantized files dequantized: all within f32 rounding.
fn check_every_file(model: &str) {
    let deq = LoadOptions {
        dequantize: true,
        ..Default::default()
    };
    for file in files(model) {
        let opts = if is_f32(&file) {
            LoadOptions::default()
        } else {
            deq.clone()
        };
        check_file(model, &file, &opts, 1e-5);
    }
}

#[test]
fn deepseek_q8_0_on_quantized_kernels_matches_tp1() {
    for m in ["deepseek_v2", "deepseek_v3"] {
        check_file(m, &format!("{m}-q8_0.gguf"), &LoadOptions::default(), 5e-2);
    }
}

#[test]
fn shards_hold_their_slices_quantized_where_block_aligned() {
    let path = fixture_dir("deepseek_v2").join("deepseek_v2-q8_0.gguf");
    let load = |world, rank, ep| {
        Model::load(
            &path,
            &LoadOptions {
                shard: Some(Shard {
                    rank,
                    world_size: world,
                    expert_parallel: ep,
                }),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let whole = Model::load(&path, &LoadOptions::default()).unwrap();
    let cfg = whole.config().clone();
    let (n, qk, v, h) = (
        cfg.num_heads,
        cfg.qk_head_dim(),
        cfg.v_head_dim,
        cfg.hidden_size,
    );
    let m = load(2, 1, false);
    let w = m.weights();
    let mla = &w.layers[0].mla;
    assert_eq!(mla.num_heads, n / 2);
    assert_eq!((mla.q_b.rows, mla.q_b.ty), (n / 2 * qk, GgmlType::Q8_0));
    // Rank 1's q_b rows are the second half of the whole q_b, byte for byte.
    let full_qb = &whole.weights().layers[0].mla.q_b;
    assert_eq!(mla.q_b.row(0), full_qb.row(n / 2 * qk));
    assert_eq!(
        (mla.w_uv.rows, mla.w_uk_t.rows),
        (n / 2 * v, n / 2 * cfg.kv_lora_rank)
    );
    // o_proj [H, N*V] keeps its columns of rank 1's heads: 64 of 128, on the 32-block grid.
    assert_eq!(
        (mla.o_proj.rows, mla.o_proj.cols, mla.o_proj.ty),
        (h, n / 2 * v, GgmlType::Q8_0)
    );
    let full_o = whole.weights().layers[0].mla.o_proj.to_f32();
    let half_o = mla.o_proj.to_f32();
    for r in 0..h {
        assert_eq!(
            &half_o[r * n / 2 * v..(r + 1) * n / 2 * v],
            &full_o[r * n * v + n / 2 * v..(r + 1) * n * v]
        );
    }
    let Ffn::Dense(dense) = &w.layers[0].ffn else {
        panic!("layer 0 is dense")
    };
    assert_eq!(
        (dense.down.cols, dense.down.ty),
        (cfg.intermediate_size / 2, GgmlType::Q8_0)
    );
    let Ffn::Moe(moe) = &w.layers[1].ffn else {
        panic!("layer 1 is MoE")
    };
    let f = cfg.moe.as_ref().unwrap().moe_intermediate_size;
    assert_eq!((moe.experts.len(), moe.first_expert), (8, 0));
    // An expert's down [H, 32] split in two is off the 32-block grid: f32.
    assert_eq!(
        (moe.experts[3].down.cols, moe.experts[3].down.ty),
        (f / 2, GgmlType::F32)
    );
    assert_eq!(
        (moe.experts[3].gate.rows, moe.experts[3].gate.ty),
        (f / 2, GgmlType::Q8_0)
    );
    // Expert-parallel: rank 1 of 2 holds experts 4..8 whole, still Q8_0.
    let m = load(2, 1, true);
    let Ffn::Moe(moe) = &m.weights().layers[1].ffn else {
        panic!("layer 1 is MoE")
    };
    assert_eq!((moe.experts.len(), moe.first_expert), (4, 4));
    assert_eq!(
        (moe.experts[0].down.cols, moe.experts[0].down.ty),
        (f, GgmlType::Q8_0)
    );
    // Shared experts (2 x 32 wide) are still sliced by intermediate.
    assert_eq!(moe.shared.as_ref().unwrap().gate.rows, 2 * f / 2);
}

#[test]
fn indivisible_sizes_are_load_errors_naming_the_quantity() {
    let path = fixture_dir("glm_moe_dsa").join("glm_moe_dsa-f32.gguf");
    let err = TpExecutor::load(&path, &LoadOptions::default(), tp(3, false))
        .err()
        .expect("4 heads on 3 ranks")
        .to_string();
    assert!(
        err.contains("num_heads") && err.contains("= 4") && err.contains("tensor-parallel size 3"),
        "{err}"
    );
    // 8 ranks split 4 heads no more than 3 do.
    let err = TpExecutor::load(&path, &LoadOptions::default(), tp(8, true))
        .err()
        .expect("4 heads on 8 ranks")
        .to_string();
    assert!(err.contains("num_heads"), "{err}");
}

#[test]
fn a_shard_cannot_run_alone_or_with_the_wrong_communicator() {
    let path = fixture_dir("deepseek_v3").join("deepseek_v3-f32.gguf");
    let opts = LoadOptions {
        shard: Some(Shard {
            rank: 1,
            world_size: 2,
            expert_parallel: false,
        }),
        ..Default::default()
    };
    let model = Model::load(&path, &opts).unwrap();
    let err = mlaserve_model::score::score(&model, &[1, 2, 3], AttentionPath::Auto, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 1 of 2") && err.contains("forward_sharded"),
        "{err}"
    );
    let comms = ThreadComm::group(2, Duration::from_secs(1));
    let mut cache = mlaserve_model::LatentCache::new(model.config(), 1, 16);
    let batch = mlaserve_model::ForwardBatch::new(
        vec![mlaserve_model::SeqInput {
            tokens: vec![1, 2],
            context_len: 0,
            block_table: vec![0],
            logits: mlaserve_model::LogitsWanted::All,
        }],
        16,
        AttentionPath::Auto,
    )
    .unwrap();
    let err = model
        .forward_sharded(&batch, &mut cache, &comms[0])
        .unwrap_err()
        .to_string();
    assert!(err.contains("communicator is rank 0 of 2"), "{err}");
}

fn fault_fixture() -> (PathBuf, Vec<u32>) {
    let m = "glm_moe_dsa";
    (
        fixture_dir(m).join("glm_moe_dsa-f32.gguf"),
        Reference::load(m).input("f32", "len13"),
    )
}

#[test]
fn a_rank_that_errors_stops_the_step_at_once_with_its_error() {
    let (path, ids) = fault_fixture();
    let opts = TpOptions {
        timeout: Duration::from_secs(60),
        ..tp(2, false)
    };
    let mut ex = TpExecutor::load(&path, &LoadOptions::default(), opts).unwrap();
    let want = score_on(&mut ex, &ids, AttentionPath::Auto, 4).unwrap();
    ex.inject_fault(1, Fault::Error).unwrap();
    let t0 = Instant::now();
    let err = score_on(&mut ex, &ids, AttentionPath::Auto, 4).unwrap_err();
    // Rank 0 was waiting in layer 0's all-reduce: it must stop now, not at the 60 s timeout.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    match &err {
        ModelError::Rank { rank: 1, error } => {
            assert!(
                error.to_string().contains("fault injected into rank 1"),
                "{err}"
            )
        }
        other => panic!("expected rank 1's own error, got {other}"),
    }
    // The group is reset: the next run is the normal one.
    assert_eq!(
        score_on(&mut ex, &ids, AttentionPath::Auto, 4).unwrap(),
        want
    );
}

#[test]
fn a_rank_that_panics_stops_the_step_with_its_panic() {
    let (path, ids) = fault_fixture();
    let mut ex = TpExecutor::load(&path, &LoadOptions::default(), tp(4, true)).unwrap();
    let want = score_on(&mut ex, &ids, AttentionPath::Auto, 0).unwrap();
    ex.inject_fault(2, Fault::Panic).unwrap();
    let t0 = Instant::now();
    let err = score_on(&mut ex, &ids, AttentionPath::Auto, 0).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    match &err {
        ModelError::RankPanicked { rank: 2, msg } => {
            assert!(msg.contains("fault injected"), "{msg}")
        }
        other => panic!("expected rank 2's panic, got {other}"),
    }
    assert_eq!(
        score_on(&mut ex, &ids, AttentionPath::Auto, 0).unwrap(),
        want
    );
}

#[test]
fn a_stalled_rank_makes_the_others_time_out_naming_it() {
    let (path, ids) = fault_fixture();
    let opts = TpOptions {
        timeout: Duration::from_millis(300),
        // One thread per rank whatever the machine: the stall is the only delay.
        pools: RankPools::Split(1),
        ..tp(2, false)
    };
    let mut ex = TpExecutor::load(&path, &LoadOptions::default(), opts).unwrap();
    let want = score_on(&mut ex, &ids, AttentionPath::Auto, 0).unwrap();
    ex.inject_fault(1, Fault::Stall(Duration::from_millis(1500)))
        .unwrap();
    let t0 = Instant::now();
    let err = score_on(&mut ex, &ids, AttentionPath::Auto, 0).unwrap_err();
    // The step ends once the stalled rank wakes and finds the group failed.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    match &err {
        ModelError::Comm(CommError::Timeout {
            rank: 0,
            collective: "all_reduce_sum",
            missing,
            ..
        }) => assert_eq!(missing, &vec![1]),
        other => panic!("expected rank 0's timeout waiting for rank 1, got {other}"),
    }
    assert_eq!(
        score_on(&mut ex, &ids, AttentionPath::Auto, 0).unwrap(),
        want
    );
}

#[test]
fn forward_before_init_cache_is_an_error_and_drop_joins_the_workers() {
    let (path, ids) = fault_fixture();
    let mut ex = TpExecutor::load(&path, &LoadOptions::default(), tp(2, false)).unwrap();
    let batch = mlaserve_model::ForwardBatch::new(
        vec![mlaserve_model::SeqInput {
            tokens: ids.clone(),
            context_len: 0,
            block_table: vec![0, 1],
            logits: mlaserve_model::LogitsWanted::Last,
        }],
        16,
        AttentionPath::Auto,
    )
    .unwrap();
    let err = ex.forward(&batch).unwrap_err().to_string();
    assert!(
        err.contains("rank 0") && err.contains("init_cache"),
        "{err}"
    );
    let t0 = Instant::now();
    drop(ex);
    assert!(t0.elapsed() < Duration::from_secs(5));
}
