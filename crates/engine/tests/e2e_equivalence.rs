//! End-to-end: the engine on the real fixture models gives the same greedy tokens however
//! the work is cut: alone, batched, chunked prefill, prefix-cache hit, preempt-and-resume —
//! and those tokens are HF's greedy references. Seeded sampling is reproducible.

mod common;
use common::*;

use mlaserve_engine::{EngineConfig, FinishReason, SamplingParams};

#[test]
fn alone_and_batched_greedy_equal_the_hf_reference() {
    for m in MODELS {
        let r = Reference::load(m);
        let handle = start(m, test_config());
        for (name, prompt) in &r.prompts {
            let out = run(&handle, prompt, greedy(16));
            assert_eq!(out.token_ids, r.greedy[name], "{m} {name} alone");
            assert_eq!(out.finish_reason, FinishReason::Length);
            assert_eq!(out.usage.prompt_tokens, prompt.len());
            assert_eq!(out.usage.completion_tokens, 16);
        }
        let reqs = r
            .prompts
            .values()
            .map(|p| (p.clone(), greedy(16)))
            .collect();
        let outs = run_batch(&handle, reqs);
        for ((name, _), out) in r.prompts.iter().zip(&outs) {
            assert_eq!(out.token_ids, r.greedy[name], "{m} {name} batched");
        }
        handle.shutdown();
        handle.wait();
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    for m in MODELS {
        let r = Reference::load(m);
        for budget in [3, 5, 8] {
            let handle = start(
                m,
                EngineConfig {
                    max_num_batched_tokens: budget,
                    ..test_config()
                },
            );
            let reqs = r
                .prompts
                .values()
                .map(|p| (p.clone(), greedy(16)))
                .collect();
            let outs = run_batch(&handle, reqs);
            for ((name, _), out) in r.prompts.iter().zip(&outs) {
                assert_eq!(
                    out.token_ids, r.greedy[name],
                    "{m} {name} with a budget of {budget} tokens per step"
                );
            }
        }
    }
}

#[test]
fn prefix_cache_hit_equals_miss_and_is_counted() {
    for m in MODELS {
        let r = Reference::load(m);
        let handle = start(
            m,
            EngineConfig {
                enable_prefix_caching: true,
                ..test_config()
            },
        );
        let prompt = &r.prompts["len24"];
        let miss = run(&handle, prompt, greedy(16));
        assert_eq!(miss.usage.cached_prompt_tokens, 0);
        assert!(eventually(|| handle.metrics().num_running == 0));
        let before = handle.metrics();
        let hit = run(&handle, prompt, greedy(16));
        // 24 tokens, 4-token blocks: the 5 full blocks before the last token are reused.
        assert_eq!(hit.usage.cached_prompt_tokens, 20, "{m}");
        assert_eq!(hit.token_ids, miss.token_ids, "{m}: hit differs from miss");
        assert_eq!(hit.token_ids, r.greedy["len24"], "{m}");
        assert!(eventually(|| handle.metrics().num_running == 0));
        let after = handle.metrics();
        assert_eq!(after.prefix_cache_queries - before.prefix_cache_queries, 24);
        assert_eq!(after.prefix_cache_hits - before.prefix_cache_hits, 20);

        // A prompt that continues a finished one (prompt + its output) reuses generated blocks too.
        let mut longer = prompt.clone();
        longer.extend(&miss.token_ids[..8]);
        let cont = run(&handle, &longer, greedy(8));
        assert!(
            cont.usage.cached_prompt_tokens >= 28,
            "{m}: {} cached",
            cont.usage.cached_prompt_tokens
        );
        assert_eq!(
            cont.token_ids,
            miss.token_ids[8..16],
            "{m}: continuation from the cache"
        );
    }
}

#[test]
fn preempt_and_resume_equals_uninterrupted() {
    for m in MODELS {
        let r = Reference::load(m);
        // 10 blocks of 4 = 40 positions: exactly one 24 + 16 sequence; four prompts need ~29.
        let cfg = EngineConfig {
            num_blocks: Some(10),
            max_model_len: Some(40),
            ..test_config()
        };
        let handle = start(m, cfg);
        let reqs = r
            .prompts
            .values()
            .map(|p| (p.clone(), greedy(16)))
            .collect();
        let outs = run_batch(&handle, reqs);
        for ((name, _), out) in r.prompts.iter().zip(&outs) {
            assert_eq!(out.token_ids, r.greedy[name], "{m} {name} after preemption");
        }
        // The snapshot is published after the step that finished the last request.
        assert!(
            eventually(|| handle.metrics().num_cache_blocks_used == 0),
            "{m}: blocks leaked"
        );
        assert!(
            handle.metrics().num_preemptions > 0,
            "{m}: the tiny pool should force preemption"
        );
    }
}

#[test]
fn seeded_sampling_is_reproducible_whatever_the_batch() {
    let m = "deepseek_v2";
    let r = Reference::load(m);
    let prompt = r.prompts["len13"].clone();
    let sampled = |seed| SamplingParams {
        temperature: 0.9,
        top_k: Some(100),
        top_p: 0.95,
        seed: Some(seed),
        ignore_eos: true,
        max_tokens: 16,
        ..SamplingParams::default()
    };
    let handle = start(m, test_config());
    let alone = run(&handle, &prompt, sampled(7));
    let again = run(&handle, &prompt, sampled(7));
    assert_eq!(alone.token_ids, again.token_ids);
    // Batched with other requests (other seeds, other prompts), in another engine.
    let handle2 = start(
        m,
        EngineConfig {
            max_num_batched_tokens: 7,
            seed: Some(99),
            ..test_config()
        },
    );
    let mut reqs: Vec<_> = r
        .prompts
        .values()
        .map(|p| (p.clone(), sampled(1)))
        .collect();
    reqs.insert(2, (prompt.clone(), sampled(7)));
    // enough requests that decode steps hold 4+ rows, sampled in parallel (PAR_SAMPLE_ROWS)
    reqs.extend((2..5).map(|seed| (prompt.clone(), sampled(seed))));
    let outs = run_batch(&handle2, reqs);
    assert_eq!(
        outs[2].token_ids, alone.token_ids,
        "same seed, different batch"
    );
    let other = run(&handle, &prompt, sampled(8));
    assert_ne!(
        other.token_ids, alone.token_ids,
        "a different seed should sample differently"
    );
    assert_ne!(
        alone.token_ids, r.greedy["len13"],
        "temperature 0.9 should not be greedy"
    );
}

/// A seeded request at a temperature alone is picked by the executor (`forward_picks`), and
/// the same request asking for logprobs is sampled on the host from its whole logits row:
/// the same tokens (the draw is one definition in integers, and the stream advances by the
/// same bits), alone or beside other rows.
#[test]
fn seeded_draws_are_the_same_picked_or_sampled_from_whole_rows() {
    let m = "deepseek_v2";
    let r = Reference::load(m);
    let prompt = r.prompts["len13"].clone();
    let sampled = |seed, logprobs| SamplingParams {
        temperature: 1.1,
        seed: Some(seed),
        ignore_eos: true,
        max_tokens: 12,
        logprobs,
        ..SamplingParams::default()
    };
    let handle = start(m, test_config());
    let picked = run(&handle, &prompt, sampled(5, None));
    let whole = run(&handle, &prompt, sampled(5, Some(1)));
    assert_eq!(whole.token_ids, picked.token_ids);
    assert_eq!(whole.logprobs.len(), 12);
    let beside = run_batch(
        &handle,
        vec![
            (r.prompts["len6"].clone(), sampled(9, Some(2))),
            (prompt.clone(), sampled(5, None)),
            (r.prompts["len6"].clone(), greedy(12)),
        ],
    );
    assert_eq!(beside[1].token_ids, picked.token_ids);
    // the whole rows beside it: as each request alone
    let alone = run(&handle, &r.prompts["len6"], sampled(9, Some(2)));
    assert_eq!(beside[0].token_ids, alone.token_ids);
    assert_eq!(beside[0].logprobs, alone.logprobs);
    assert_eq!(beside[2].token_ids, r.greedy["len6"][..12]);
    assert_ne!(
        picked.token_ids, r.greedy["len13"],
        "temperature 1.1 should not be greedy"
    );
}
