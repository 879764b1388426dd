//! Property tests of the scheduler under random add / step / abort sequences with a small
//! block pool, against a simulated latent cache.
//!
//! Each slot of the simulated cache records the fingerprint of the prefix whose last token
//! was written there. Every step checks that each scheduled sequence reads back exactly its
//! own prefix at every cached position (so prefix-cache hits, block sharing and preemption
//! never hand a sequence someone else's rows), that writes only land in blocks the writer
//! holds alone, that the step respects the token budget and sequence cap, and that block
//! integrity holds. At the end every request has finished or been aborted and every block
//! is free.

use std::collections::{HashMap, HashSet};

use mlaserve_engine::scheduler::{Scheduler, SchedulerConfig};
use mlaserve_engine::sequence::Sequence;
use mlaserve_engine::{FinishReason, SamplingParams};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Add {
        pattern: u8,
        len: usize,
        max_tokens: usize,
    },
    Step,
    Abort(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u8..3, 1usize..24, 1usize..10).prop_map(|(pattern, len, max_tokens)| Op::Add { pattern, len, max_tokens }),
        5 => Just(Op::Step),
        1 => (0usize..16).prop_map(Op::Abort),
    ]
}

fn prompt(pattern: u8, len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            if i < 10 {
                pattern as u32 * 50 + i
            } else {
                500 + salt * 31 + i
            }
        })
        .collect()
}

/// Fingerprint of `tokens[..=p]` for every p.
fn prefix_fingerprints(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ t as u64)
                .wrapping_mul(0x0000_0100_0000_01B3)
                .rotate_left(5);
            h
        })
        .collect()
}

struct Harness {
    sched: Scheduler,
    block_size: usize,
    max_model_len: usize,
    cache: Vec<Option<u64>>,
    next_id: u64,
    live: HashSet<u64>,
    ended: HashMap<u64, FinishReason>,
}

impl Harness {
    fn slot(&self, seq: &Sequence, p: usize) -> usize {
        seq.block_table.blocks()[p / self.block_size] as usize * self.block_size
            + p % self.block_size
    }

    fn step(&mut self, cfg: &SchedulerConfig) -> Result<(), TestCaseError> {
        let out = self.sched.schedule();
        self.sched.check_integrity().map_err(TestCaseError::fail)?;
        if self.sched.has_unfinished() {
            prop_assert!(!out.is_empty(), "live requests but nothing scheduled");
        }
        prop_assert!(out.num_batched_tokens() <= cfg.max_num_batched_tokens);
        prop_assert!(
            out.seqs.len() <= cfg.max_num_seqs && self.sched.num_running() <= cfg.max_num_seqs
        );
        let ids: HashSet<u64> = out.seqs.iter().map(|s| s.id).collect();
        prop_assert_eq!(ids.len(), out.seqs.len(), "a sequence scheduled twice");
        // Block owners, to check that writes only hit exclusively held blocks.
        let mut owners: HashMap<u32, usize> = HashMap::new();
        for id in self.sched.seq_ids() {
            for &b in self.sched.seq(id).unwrap().block_table.blocks() {
                *owners.entry(b).or_default() += 1;
            }
        }
        for s in &out.seqs {
            let seq = self.sched.seq(s.id).unwrap();
            prop_assert!(s.num_new_tokens >= 1);
            prop_assert_eq!(s.context_len, seq.num_computed_tokens);
            prop_assert!(s.context_len + s.num_new_tokens <= seq.num_tokens());
            prop_assert_eq!(
                s.wants_logits,
                s.context_len + s.num_new_tokens == seq.num_tokens()
            );
            prop_assert!(
                seq.block_table.len() * self.block_size >= s.context_len + s.num_new_tokens
            );
            let fp = prefix_fingerprints(seq.token_ids());
            for (p, &want) in fp.iter().enumerate().take(s.context_len) {
                prop_assert_eq!(
                    self.cache[self.slot(seq, p)],
                    Some(want),
                    "seq {} reads a wrong row at {}",
                    s.id,
                    p
                );
            }
            for p in s.context_len..s.context_len + s.num_new_tokens {
                let b = seq.block_table.blocks()[p / self.block_size];
                prop_assert_eq!(
                    owners[&b],
                    1,
                    "seq {} writes position {} into shared block {}",
                    s.id,
                    p,
                    b
                );
            }
        }
        for s in &out.seqs {
            let seq = self.sched.seq(s.id).unwrap();
            let fp = prefix_fingerprints(seq.token_ids());
            let written = s.context_len..s.context_len + s.num_new_tokens;
            for (p, &row) in fp.iter().enumerate().take(written.end).skip(written.start) {
                let slot = self.slot(seq, p);
                self.cache[slot] = Some(row);
            }
        }
        self.sched.complete_step(&out);
        for s in out.seqs.iter().filter(|s| s.wants_logits) {
            let n = self.sched.seq(s.id).unwrap().num_tokens() as u32;
            let token = (s.id as u32 * 13 + n * 7) % 97;
            let seq = self.sched.append_token(s.id, token).unwrap();
            if let Some(reason) = seq.check_token_stop(&[], self.max_model_len) {
                self.end(s.id, reason);
            }
        }
        self.sched.check_integrity().map_err(TestCaseError::fail)?;
        Ok(())
    }

    fn end(&mut self, id: u64, reason: FinishReason) {
        let seq = self.sched.remove(id).expect("live");
        assert!(seq.block_table.is_empty(), "remove frees the blocks");
        self.live.remove(&id);
        self.ended.insert(id, reason);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn scheduler_serves_every_request_without_leaks_or_corruption(
        num_blocks in 4usize..16,
        block_size in 1usize..5,
        max_num_seqs in 1usize..5,
        max_num_batched_tokens in 1usize..20,
        caching in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let cfg = SchedulerConfig { max_num_seqs, max_num_batched_tokens, block_size, num_blocks, enable_prefix_caching: caching };
        let max_model_len = num_blocks * block_size;
        let mut h = Harness {
            sched: Scheduler::new(cfg.clone()),
            block_size,
            max_model_len,
            cache: vec![None; num_blocks * block_size],
            next_id: 0,
            live: HashSet::new(),
            ended: HashMap::new(),
        };
        for op in ops {
            match op {
                Op::Add { pattern, len, max_tokens } => {
                    let len = len.min(max_model_len - 1);
                    let id = h.next_id;
                    h.next_id += 1;
                    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) };
                    h.sched.add(Sequence::new(id, id, prompt(pattern, len, id as u32 % 2), params, id));
                    h.live.insert(id);
                }
                Op::Step => h.step(&cfg)?,
                Op::Abort(k) => {
                    let mut ids: Vec<u64> = h.live.iter().copied().collect();
                    ids.sort_unstable();
                    if !ids.is_empty() {
                        h.end(ids[k % ids.len()], FinishReason::Abort);
                    }
                }
            }
            h.sched.check_integrity().map_err(TestCaseError::fail)?;
        }
        let mut steps = 0;
        while h.sched.has_unfinished() {
            h.step(&cfg)?;
            steps += 1;
            prop_assert!(steps < 20_000, "requests never finish");
        }
        prop_assert_eq!(h.ended.len() as u64, h.next_id, "every request finished or was aborted");
        prop_assert_eq!(h.sched.block_manager().num_used_blocks(), 0);
        prop_assert_eq!(h.sched.block_manager().num_free_blocks(), num_blocks);
        h.sched.check_integrity().map_err(TestCaseError::fail)?;
        let stats = h.sched.prefix_cache_stats();
        prop_assert!(stats.hits <= stats.queries);
        if !caching {
            prop_assert_eq!(stats.hits, 0);
        }
    }
}

/// A focused case: a tiny pool forces the newest request to be preempted; it resumes with
/// its generated tokens kept, and both finish.
#[test]
fn newest_request_is_preempted_and_resumes_with_its_output() {
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        block_size: 2,
        num_blocks: 4,
        enable_prefix_caching: false,
    };
    let mut s = Scheduler::new(cfg);
    for id in 0..2u64 {
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(3)
        };
        s.add(Sequence::new(id, id, vec![1, 2, 3], params, 0));
    }
    let mut preempted = Vec::new();
    let mut outputs: HashMap<u64, Vec<u32>> = HashMap::new();
    for _ in 0..50 {
        if !s.has_unfinished() {
            break;
        }
        let out = s.schedule();
        preempted.extend(out.preempted.iter().copied());
        s.complete_step(&out);
        for sc in out.seqs.iter().filter(|x| x.wants_logits) {
            let seq = s.append_token(sc.id, 40 + sc.id as u32).unwrap();
            if seq.check_token_stop(&[], 8).is_some() {
                let seq = s.remove(sc.id).unwrap();
                outputs.insert(sc.id, seq.output_tokens().to_vec());
            }
        }
        s.check_integrity().unwrap();
    }
    assert_eq!(
        preempted.first(),
        Some(&1),
        "the newest request is the victim"
    );
    assert_eq!(outputs[&0], vec![40, 40, 40]);
    assert_eq!(outputs[&1], vec![41, 41, 41]);
    assert_eq!(s.block_manager().num_used_blocks(), 0);
}

/// A long prompt is prefilled in budget-sized chunks; only the last chunk wants logits.
#[test]
fn long_prompt_is_chunked() {
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 4,
        block_size: 4,
        num_blocks: 8,
        enable_prefix_caching: true,
    };
    let mut s = Scheduler::new(cfg);
    s.add(Sequence::new(
        0,
        0,
        (0..10).collect(),
        SamplingParams::greedy(1),
        0,
    ));
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let out = s.schedule();
        chunks.push((
            out.seqs[0].context_len,
            out.seqs[0].num_new_tokens,
            out.seqs[0].wants_logits,
        ));
        s.complete_step(&out);
    }
    assert_eq!(chunks, vec![(0, 4, false), (4, 4, false), (8, 2, true)]);
    s.append_token(0, 99);
    // A second identical prompt skips the two full cached blocks.
    s.add(Sequence::new(
        1,
        1,
        (0..10).collect(),
        SamplingParams::greedy(1),
        0,
    ));
    let out = s.schedule();
    let sc = out.seqs.iter().find(|x| x.id == 1).unwrap();
    assert_eq!((sc.context_len, sc.num_new_tokens), (8, 2));
    assert_eq!(s.seq(1).unwrap().num_cached_prompt_tokens, Some(8));
}
