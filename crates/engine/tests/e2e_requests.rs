//! End-to-end request handling on a real fixture model: stop strings / stop ids / EOS,
//! logprobs, validation errors that leave the engine serving, aborts that free blocks,
//! the waiting-queue cap, and a draining shutdown.

mod common;
use common::*;

use mlaserve_engine::{
    EngineConfig, EngineError, FinishReason, GenerateRequest, RequestEvent, SamplingParams,
};

const M: &str = "deepseek_v2";

#[test]
fn stop_string_cuts_the_text_before_it_and_ends_the_request() {
    let r = Reference::load(M);
    let handle = start(M, test_config());
    let prompt = &r.prompts["len13"];
    let full = run(&handle, prompt, greedy(16));
    let tok = handle.tokenizer().clone();
    assert_eq!(
        full.text,
        tok.decode(&full.token_ids, true).unwrap(),
        "streamed text = full decode"
    );
    // A stop string from the middle of the text (spanning token boundaries in general).
    let chars: Vec<(usize, char)> = full.text.char_indices().collect();
    assert!(chars.len() >= 8, "need some text to cut: {:?}", full.text);
    let (a, b) = (chars[chars.len() / 2 - 1].0, chars[chars.len() / 2 + 2].0);
    let stop = full.text[a..b].to_string();
    let cut = full.text.find(&stop).unwrap();
    let out = run(
        &handle,
        prompt,
        SamplingParams {
            stop: vec![stop.clone()],
            ..greedy(16)
        },
    );
    assert_eq!(out.finish_reason, FinishReason::Stop, "stop {stop:?}");
    assert_eq!(
        out.text,
        full.text[..cut],
        "text before the stop string {stop:?}"
    );
    assert!(full.token_ids.starts_with(&out.token_ids));
    assert!(out.token_ids.len() < 16);
    assert_eq!(out.usage.completion_tokens, out.token_ids.len());
}

#[test]
fn stop_token_id_and_eos_end_generation_without_their_text() {
    let r = Reference::load(M);
    let handle = start(M, test_config());
    let prompt = &r.prompts["len6"];
    let want = &r.greedy["len6"];
    let k = 5;
    let first = want.iter().position(|&t| t == want[k]).unwrap();
    let out = run(
        &handle,
        prompt,
        SamplingParams {
            stop_token_ids: vec![want[k]],
            ..greedy(16)
        },
    );
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.token_ids, want[..=first]);
    let tok = handle.tokenizer();
    assert_eq!(out.text, tok.decode(&want[..first], true).unwrap());

    // deepseek_v3's greedy continuation of len6 starts with EOS (id 1).
    let r3 = Reference::load("deepseek_v3");
    assert_eq!(r3.greedy["len6"][0], 1);
    let h3 = start("deepseek_v3", test_config());
    let out = run(&h3, &r3.prompts["len6"], SamplingParams::greedy(16));
    assert_eq!(
        (out.finish_reason, out.token_ids.clone(), out.text.as_str()),
        (FinishReason::Stop, vec![1], "")
    );
    let out = run(&h3, &r3.prompts["len6"], greedy(16));
    assert_eq!(
        out.token_ids, r3.greedy["len6"],
        "ignore_eos generates past EOS"
    );
}

#[test]
fn logprobs_are_consistent_with_greedy_choices() {
    let r = Reference::load(M);
    let handle = start(M, test_config());
    let out = run(
        &handle,
        &r.prompts["len6"],
        SamplingParams {
            logprobs: Some(5),
            ..greedy(8)
        },
    );
    assert_eq!(out.logprobs.len(), 8);
    for (lp, &id) in out.logprobs.iter().zip(&out.token_ids) {
        assert_eq!(lp.token_id, id);
        assert_eq!(lp.top.len(), 5);
        assert_eq!(
            lp.top[0],
            (id, lp.logprob),
            "greedy picks the most likely token"
        );
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(lp.top.iter().all(|&(_, l)| l <= 0.0 && l.is_finite()));
    }
}

#[test]
fn bad_requests_are_refused_and_the_engine_keeps_serving() {
    let r = Reference::load(M);
    let handle = start(
        M,
        EngineConfig {
            max_model_len: Some(32),
            ..test_config()
        },
    );
    let add = |prompt: Vec<u32>, params| {
        handle
            .add(GenerateRequest {
                prompt_tokens: prompt,
                params,
            })
            .map(|_| ())
    };
    assert!(
        matches!(add(vec![], greedy(4)), Err(EngineError::InvalidRequest(m)) if m.contains("empty"))
    );
    assert_eq!(
        add(vec![3; 32], greedy(4)),
        Err(EngineError::PromptTooLong {
            prompt: 32,
            max: 32
        })
    );
    assert!(
        matches!(add(vec![3, 512], greedy(4)), Err(EngineError::InvalidRequest(m)) if m.contains("512"))
    );
    assert!(
        matches!(add(vec![3], greedy(0)), Err(EngineError::InvalidRequest(m)) if m.contains("max_tokens"))
    );
    let bad_t = SamplingParams {
        temperature: -1.0,
        ..greedy(4)
    };
    assert!(
        matches!(add(vec![3], bad_t), Err(EngineError::InvalidRequest(m)) if m.contains("temperature"))
    );
    // Still serving, and max_tokens past the context ends at max_model_len.
    let out = run(&handle, &r.prompts["len24"], greedy(100));
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.token_ids.len(), 32 - 24);
    assert_eq!(out.token_ids, r.greedy["len24"][..8]);
}

#[test]
fn dropping_a_stream_or_aborting_frees_the_request() {
    let r = Reference::load(M);
    let handle = start(M, test_config());
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(200)
    };
    let mut stream = handle
        .add(GenerateRequest {
            prompt_tokens: r.prompts["len24"].clone(),
            params: params.clone(),
        })
        .unwrap();
    assert!(matches!(
        stream.blocking_recv(),
        Some(RequestEvent::Token { .. })
    ));
    drop(stream);
    assert!(eventually(|| {
        let m = handle.metrics();
        m.num_running == 0
            && m.num_waiting == 0
            && m.num_cache_blocks_used == 0
            && m.num_aborted == 1
    }));

    let mut stream = handle
        .add(GenerateRequest {
            prompt_tokens: r.prompts["len13"].clone(),
            params,
        })
        .unwrap();
    assert!(matches!(
        stream.blocking_recv(),
        Some(RequestEvent::Token { .. })
    ));
    handle.abort(stream.id);
    let last = std::iter::from_fn(|| stream.blocking_recv()).last();
    assert!(
        matches!(
            last,
            Some(RequestEvent::Finished {
                reason: FinishReason::Abort,
                ..
            })
        ),
        "{last:?}"
    );
    assert!(eventually(|| handle.metrics().num_cache_blocks_used == 0));
}

#[test]
fn the_waiting_queue_is_capped() {
    let r = Reference::load(M);
    let handle = start(
        M,
        EngineConfig {
            max_num_seqs: 1,
            max_waiting: 2,
            ..test_config()
        },
    );
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(200)
    };
    let results: Vec<_> = (0..4)
        .map(|_| {
            handle.add(GenerateRequest {
                prompt_tokens: r.prompts["len6"].clone(),
                params: params.clone(),
            })
        })
        .collect();
    // One runs at most; so at least three were queued at once and one of them was refused.
    assert!(results
        .iter()
        .any(|r| matches!(r, Err(EngineError::QueueFull))));
    let accepted = results.iter().filter(|r| r.is_ok()).count() as u64;
    drop(results);
    assert!(eventually(|| {
        let m = handle.metrics();
        m.num_aborted == accepted
            && m.num_running == 0
            && m.num_waiting == 0
            && m.num_cache_blocks_used == 0
    }));
    assert!(handle
        .add(GenerateRequest {
            prompt_tokens: vec![0],
            params: greedy(1)
        })
        .is_ok());
}

#[test]
fn shutdown_drains_live_requests_then_refuses() {
    let r = Reference::load(M);
    let handle = start(M, test_config());
    let streams: Vec<_> = r
        .prompts
        .values()
        .map(|p| {
            handle
                .add(GenerateRequest {
                    prompt_tokens: p.clone(),
                    params: greedy(16),
                })
                .unwrap()
        })
        .collect();
    handle.shutdown();
    assert_eq!(
        handle
            .add(GenerateRequest {
                prompt_tokens: vec![0],
                params: greedy(1)
            })
            .unwrap_err(),
        EngineError::Shutdown
    );
    handle.wait();
    for ((name, _), s) in r.prompts.iter().zip(streams) {
        let out = mlaserve_engine::collect_output(s).expect("drained to completion");
        assert_eq!(out.token_ids, r.greedy[name]);
    }
}

#[test]
fn engine_config_is_validated_against_the_model() {
    let (model, tok) = load(M);
    let cfg = model.config().clone();
    assert_eq!(cfg.context_length, 256);
    let base = EngineConfig {
        num_blocks: None,
        max_model_len: None,
        block_size: 4,
        ..EngineConfig::default()
    };
    // Derived from memory; the model's context fits.
    let r = base.resolve(&cfg).unwrap();
    assert_eq!(r.max_model_len, 256);
    let per_block = mlaserve_model::LatentCache::bytes_per_block(&cfg, 4);
    assert_eq!(r.num_blocks, base.cache_memory_bytes / per_block);
    // A cache smaller than the context caps max_model_len when it was not asked for...
    let small = EngineConfig {
        num_blocks: Some(10),
        ..base.clone()
    };
    assert_eq!(small.resolve(&cfg).unwrap().max_model_len, 40);
    // ...and is an error when it was.
    let err = EngineConfig {
        max_model_len: Some(41),
        ..small
    }
    .resolve(&cfg)
    .unwrap_err();
    assert!(err.contains("max_model_len 41"), "{err}");
    let err = EngineConfig {
        max_model_len: Some(257),
        ..base.clone()
    }
    .resolve(&cfg)
    .unwrap_err();
    assert!(err.contains("context length 256"), "{err}");
    let err = EngineConfig {
        cache_memory_bytes: 10,
        ..base.clone()
    }
    .resolve(&cfg)
    .unwrap_err();
    assert!(err.contains("cache_memory_bytes"), "{err}");
    let err = EngineConfig {
        max_num_seqs: 0,
        ..base.clone()
    }
    .resolve(&cfg)
    .unwrap_err();
    assert!(err.contains("max_num_seqs"), "{err}");
    // start_engine reports it as an error, not a panic.
    let bad = EngineConfig {
        block_size: 0,
        ..base
    };
    assert!(
        matches!(mlaserve_engine::start_engine(model, tok, bad), Err(EngineError::InvalidRequest(m)) if m.contains("block_size"))
    );
}

/// The engine's step counters split prefill steps (a prompt chunk, its one-token last chunk
/// too) from decode steps (every sequence one token past its prompt), count their tokens and
/// time them.
#[test]
fn step_times_split_prefill_from_decode_steps() {
    let r = Reference::load(M);
    let prompt = &r.prompts["len13"];
    // 13 tokens at once, or in chunks of 4, 4, 4 and 1
    for (budget, prefill_steps) in [(512, 1), (4, 4)] {
        let handle = start(
            M,
            EngineConfig {
                max_num_batched_tokens: budget,
                ..test_config()
            },
        );
        let out = run(
            &handle,
            prompt,
            SamplingParams {
                ignore_eos: true,
                ..greedy(16)
            },
        );
        assert_eq!(out.token_ids.len(), 16);
        assert!(eventually(|| handle.metrics().num_running == 0));
        let m = handle.metrics();
        let (p, d) = (m.prefill_steps, m.decode_steps);
        assert_eq!(
            (p.steps, p.tokens),
            (prefill_steps, 13),
            "budget {budget}: {m:?}"
        );
        // the first token comes from the prompt's last chunk, the other 15 from decode steps
        assert_eq!((d.steps, d.tokens), (15, 15), "budget {budget}: {m:?}");
        assert_eq!(p.steps + d.steps, m.num_steps);
        assert!(p.forward_seconds > 0.0 && d.forward_seconds > 0.0 && d.host_seconds > 0.0);
    }
}

/// The model runner asks the executor for device picks of the rows that are greedy or a
/// draw (with top-k/top-p/min-p or not), and for the whole logits of the others (logprobs, a
/// penalty): a greedy row beside any of them is still picked. The picked rows are the whole
/// rows' argmaxes.
#[test]
fn a_steps_rows_are_picked_on_the_device_unless_they_need_their_whole_row() {
    use mlaserve_engine::model_runner::{ModelRunner, StepRows};
    use mlaserve_engine::scheduler::{Scheduler, SchedulerConfig};
    use mlaserve_engine::sequence::Sequence;
    use mlaserve_model::{
        CpuExecutor, Executor, ForwardBatch, ModelError, RowArgmax, RowDraw, RowPick,
    };
    use std::sync::{Arc, Mutex};

    /// The CPU executor, recording which of its entry points each step took.
    struct Recording {
        inner: CpuExecutor,
        calls: Arc<Mutex<Vec<&'static str>>>,
    }
    impl Executor for Recording {
        fn config(&self) -> &mlaserve_model::ModelConfig {
            self.inner.config()
        }
        fn attention_path(&self) -> mlaserve_model::AttentionPath {
            self.inner.attention_path()
        }
        fn init_cache(&mut self, n: usize, bs: usize) -> Result<(), ModelError> {
            self.inner.init_cache(n, bs)
        }
        fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, ModelError> {
            self.inner.forward(b)
        }
        fn forward_into(&mut self, b: &ForwardBatch, out: &mut Vec<f32>) -> Result<(), ModelError> {
            self.calls.lock().unwrap().push("logits");
            self.inner.forward_into(b, out)
        }
        fn forward_picks(
            &mut self,
            b: &ForwardBatch,
            draws: &[RowDraw],
            out: &mut Vec<RowPick>,
            whole: &mut Vec<f32>,
        ) -> Result<(), ModelError> {
            self.calls.lock().unwrap().push("picks");
            self.inner.forward_picks(b, draws, out, whole)
        }
        fn device(&self) -> String {
            "cpu (recording)".into()
        }
    }

    let r = Reference::load(M);
    let (model, _) = load(M);
    let model = Arc::new(model);
    type Edit = fn(&mut SamplingParams);
    let other: [(&str, Edit); 8] = [
        ("greedy", |_| {}),
        ("temperature", |p| p.temperature = 0.7),
        ("top-p", |p| {
            p.temperature = 0.7;
            p.top_p = 0.9
        }),
        ("top-k", |p| {
            p.temperature = 1.0;
            p.top_k = Some(3)
        }),
        ("greedy top-k", |p| p.top_k = Some(3)),
        ("logprobs", |p| p.logprobs = Some(2)),
        ("repetition penalty", |p| p.repetition_penalty = 1.2),
        ("presence penalty", |p| p.presence_penalty = 0.5),
    ];
    // a runner over the CPU executor that records its entry points, and a scheduler for it
    let recording_runner = || {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let exec = Recording {
            inner: CpuExecutor::new(model.clone()),
            calls: calls.clone(),
        };
        (ModelRunner::new(Box::new(exec), 64, 4).unwrap(), calls)
    };
    let scheduler = || {
        Scheduler::new(SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 512,
            block_size: 4,
            num_blocks: 64,
            enable_prefix_caching: false,
        })
    };
    let mut tokens = Vec::new();
    for (name, f) in other {
        let (mut runner, calls) = recording_runner();
        let mut sched = scheduler();
        let mut second = greedy(4);
        f(&mut second);
        sched.add(Sequence::new(0, 0, r.prompts["len6"].clone(), greedy(4), 1));
        sched.add(Sequence::new(1, 1, r.prompts["len13"].clone(), second, 2));
        let out = sched.schedule();
        assert_eq!(out.seqs.len(), 2, "{name}: both prompts in one step");
        let step = runner.run(&out, &sched).unwrap();
        assert_eq!(*calls.lock().unwrap(), ["picks"], "{name}");
        let picked_only = matches!(
            name,
            "greedy" | "temperature" | "greedy top-k" | "top-p" | "top-k"
        );
        let StepRows::Picks { picks, .. } = &step.rows else {
            panic!("{name}: not picked");
        };
        assert!(step.row(0).is_none(), "{name}: the greedy row is picked");
        match step.row(1) {
            None => assert!(picked_only, "{name}: the second row needs its whole row"),
            Some(row) => {
                assert!(!picked_only, "{name}: the second row is picked");
                assert_eq!(RowArgmax::of(row), picks[1].argmax, "{name}");
            }
        }
        tokens.push(picks[0].token_id);
    }
    assert!(
        tokens.iter().all(|&t| t == r.greedy["len6"][0]),
        "{tokens:?}"
    );

    // Several whole rows around a picked one: each whole row is its own row (the runner's
    // whole_at in order), each picked row its own argmax; then every row whole: the plain step.
    let (mut runner, calls) = recording_runner();
    let mut sched = scheduler();
    let logprobs = SamplingParams {
        logprobs: Some(1),
        ..greedy(4)
    };
    let penalty = SamplingParams {
        repetition_penalty: 1.3,
        ..greedy(4)
    };
    let prompts = ["len6", "len13", "len6", "len13"];
    let params = [logprobs.clone(), greedy(4), penalty.clone(), logprobs];
    for (i, (p, q)) in prompts.iter().zip(params).enumerate() {
        sched.add(Sequence::new(
            i as u64,
            i as u64,
            r.prompts[*p].clone(),
            q,
            3,
        ));
    }
    let out = sched.schedule();
    assert_eq!(out.seqs.len(), 4, "four prompts in one step");
    let step = runner.run(&out, &sched).unwrap();
    let StepRows::Picks { picks, .. } = &step.rows else {
        panic!("a picked row beside whole ones: not picked");
    };
    for (i, p) in prompts.iter().enumerate() {
        let want = r.greedy[*p][0];
        match step.row(i) {
            Some(row) => {
                assert_ne!(i, 1, "row 1 is picked");
                assert_eq!(RowArgmax::of(row), picks[i].argmax, "row {i}");
                assert_eq!(RowArgmax::of(row).token_id, want, "row {i}: its own row");
            }
            None => {
                assert_eq!(i, 1, "row {i} needs its whole row");
                assert_eq!(picks[i].token_id, want, "row 1's pick");
            }
        }
    }
    let mut sched2 = scheduler();
    sched2.add(Sequence::new(0, 0, r.prompts["len6"].clone(), penalty, 3));
    let step = runner.run(&sched2.schedule(), &sched2).unwrap();
    assert!(
        matches!(step.rows, StepRows::Logits(_)),
        "every row whole: the plain step"
    );
    assert_eq!(*calls.lock().unwrap(), ["picks", "logits"]);
}
