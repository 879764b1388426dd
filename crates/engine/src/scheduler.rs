//! Continuous-batching scheduler in the style of vLLM v1: every step gets a token budget
//! (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`), and any sequence may
//! contribute any number of its not-yet-computed tokens, so decodes, prefill chunks and
//! prefix-cache hits are one mechanism.
//!
//! Order within a step:
//! 1. running sequences with one token to compute (decodes), oldest admission first;
//! 2. running sequences still prefilling (the next chunk of a long prompt);
//! 3. waiting sequences, first come first served, only if nothing was preempted this step.
//!    On admission, full cached blocks of the prompt are taken from the prefix cache and
//!    those tokens are skipped (the last token is always computed, for its logits).
//!
//! When a running sequence cannot get a block, the NEWEST running sequence (largest
//! arrival) is preempted by recompute: its blocks are freed, its generated tokens are kept,
//! it goes back to the front of the waiting queue, and on re-admission prompt + output are
//! prefilled again. If the newest is the one asking, it is the one preempted. So the oldest
//! request always progresses, as long as one sequence of `max_model_len` tokens fits in the
//! cache (the engine checks that at start).

use std::collections::{HashMap, VecDeque};

use crate::block_manager::{BlockManager, PrefixCacheStats};
use crate::request::RequestId;
use crate::sequence::{Sequence, SequenceStatus};

/// Limits of one step and the cache geometry.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub enable_prefix_caching: bool,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    /// Positions already in the cache before this step.
    pub context_len: usize,
    /// Tokens computed this step: `token_ids[context_len..context_len + num_new_tokens]`.
    pub num_new_tokens: usize,
    /// The chunk reaches the end of the known tokens, so a token is sampled from its logits.
    pub wants_logits: bool,
}

/// The plan of one step.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    /// Sequences preempted (blocks freed, back to waiting) during this schedule.
    pub preempted: Vec<RequestId>,
    /// Sequences admitted from waiting for the first time.
    pub first_admitted: Vec<RequestId>,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn num_batched_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.num_new_tokens).sum()
    }
}

/// Waiting queue, running set, and the block manager they share.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    block_manager: BlockManager,
    seqs: HashMap<RequestId, Sequence>,
    waiting: VecDeque<RequestId>,
    /// In admission order.
    running: Vec<RequestId>,
    num_preemptions: u64,
}

impl Scheduler {
    /// `cfg` must have every count > 0 (the engine validates it).
    pub fn new(cfg: SchedulerConfig) -> Self {
        assert!(
            cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0,
            "scheduler limits must be > 0"
        );
        let block_manager =
            BlockManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching);
        Self {
            cfg,
            block_manager,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.block_manager
    }

    /// Queues a new sequence (it must be `Waiting` and hold no blocks).
    pub fn add(&mut self, seq: Sequence) {
        assert!(seq.status == SequenceStatus::Waiting && seq.block_table.is_empty());
        assert!(
            !self.seqs.contains_key(&seq.id),
            "request id {} added twice",
            seq.id
        );
        self.waiting.push_back(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    pub fn seq(&self, id: RequestId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    pub(crate) fn seq_mut(&mut self, id: RequestId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&id)
    }

    /// Ids of every live sequence (waiting and running).
    pub fn seq_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.seqs.keys().copied()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.block_manager.prefix_cache_stats()
    }

    /// Plans one step: see the module doc for the order.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;

        for decode_pass in [true, false] {
            let candidates: Vec<RequestId> = self
                .running
                .iter()
                .copied()
                .filter(|id| {
                    let n = self.seqs[id].num_uncomputed_tokens();
                    // n == 0 only between a step and its sampled token; nothing to compute.
                    n > 0 && (n == 1) == decode_pass
                })
                .collect();
            for id in candidates {
                if budget == 0 {
                    break;
                }
                if self.seqs[&id].status != SequenceStatus::Running {
                    continue; // preempted earlier in this step
                }
                self.schedule_running(id, &mut budget, &mut out);
            }
        }

        if out.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                if !self.admit(id, &mut budget, &mut out) {
                    break; // first come, first served: nobody overtakes the head
                }
            }
        }
        out
    }

    /// Schedules the next chunk of a running sequence, preempting the newest running
    /// sequences until its blocks fit (possibly itself).
    fn schedule_running(&mut self, id: RequestId, budget: &mut usize, out: &mut SchedulerOutput) {
        let seq = &self.seqs[&id];
        let context_len = seq.num_computed_tokens;
        let num_new_tokens = seq.num_uncomputed_tokens().min(*budget);
        let wants_logits = context_len + num_new_tokens == seq.num_tokens();
        loop {
            let seq = self.seqs.get_mut(&id).expect("running id is live");
            if self
                .block_manager
                .can_append(&seq.block_table, context_len + num_new_tokens)
            {
                self.block_manager
                    .append_slot(&mut seq.block_table, context_len + num_new_tokens)
                    .expect("can_append was checked");
                *budget -= num_new_tokens;
                out.seqs.push(ScheduledSeq {
                    id,
                    context_len,
                    num_new_tokens,
                    wants_logits,
                });
                return;
            }
            let victim = self
                .newest_running()
                .expect("the asking sequence is running");
            self.preempt(victim, budget, out);
            if victim == id {
                return;
            }
        }
    }

    /// Tries to admit the head of the waiting queue with as much of it as the budget allows.
    fn admit(&mut self, id: RequestId, budget: &mut usize, out: &mut SchedulerOutput) -> bool {
        let seq = self.seqs.get_mut(&id).expect("waiting id is live");
        debug_assert!(seq.block_table.is_empty() && seq.num_computed_tokens == 0);
        let prefix = self.block_manager.find_cached_prefix(seq.token_ids());
        let context_len = prefix.num_tokens(self.cfg.block_size);
        let num_new_tokens = (seq.num_tokens() - context_len).min(*budget);
        let total = context_len + num_new_tokens;
        if !self
            .block_manager
            .can_allocate(&seq.block_table, &prefix, total)
        {
            return false;
        }
        if self
            .block_manager
            .allocate(&mut seq.block_table, prefix, total)
            .is_err()
        {
            return false;
        }
        seq.num_computed_tokens = context_len;
        seq.status = SequenceStatus::Running;
        if seq.num_cached_prompt_tokens.is_none() {
            seq.num_cached_prompt_tokens = Some(context_len.min(seq.prompt_len()));
            out.first_admitted.push(id);
        }
        let wants_logits = total == seq.num_tokens();
        self.waiting.pop_front();
        self.running.push(id);
        *budget -= num_new_tokens;
        out.seqs.push(ScheduledSeq {
            id,
            context_len,
            num_new_tokens,
            wants_logits,
        });
        true
    }

    fn newest_running(&self) -> Option<RequestId> {
        self.running
            .iter()
            .copied()
            .max_by_key(|id| self.seqs[id].arrival)
    }

    /// Recompute preemption: free the blocks, keep the tokens, back to the waiting front.
    /// If the victim was already scheduled this step, its tokens go back to the budget.
    fn preempt(&mut self, id: RequestId, budget: &mut usize, out: &mut SchedulerOutput) {
        if let Some(pos) = out.seqs.iter().position(|s| s.id == id) {
            *budget += out.seqs.remove(pos).num_new_tokens;
        }
        let seq = self.seqs.get_mut(&id).expect("victim is live");
        self.block_manager.free(&mut seq.block_table);
        seq.num_computed_tokens = 0;
        seq.status = SequenceStatus::Waiting;
        seq.num_preemptions += 1;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.num_preemptions += 1;
        out.preempted.push(id);
    }

    /// After the step's forward pass: the scheduled tokens' rows are in the cache. Advances
    /// `num_computed_tokens` and registers newly full blocks in the prefix cache.
    pub fn complete_step(&mut self, out: &SchedulerOutput) {
        for s in &out.seqs {
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            if seq.status != SequenceStatus::Running || seq.num_computed_tokens != s.context_len {
                continue; // finished or preempted meanwhile
            }
            seq.num_computed_tokens += s.num_new_tokens;
            let num_computed = seq.num_computed_tokens;
            let (table, token_ids) = seq.block_table_and_tokens();
            self.block_manager
                .cache_full_blocks(table, token_ids, num_computed);
        }
    }

    /// Appends a sampled token to a running sequence and returns it.
    pub fn append_token(&mut self, id: RequestId, token_id: u32) -> Option<&Sequence> {
        let seq = self.seqs.get_mut(&id)?;
        seq.append_token(token_id);
        Some(seq)
    }

    /// Removes a sequence (finished, aborted or failed) and frees its blocks at once.
    pub fn remove(&mut self, id: RequestId) -> Option<Sequence> {
        let mut seq = self.seqs.remove(&id)?;
        self.block_manager.free(&mut seq.block_table);
        match seq.status {
            SequenceStatus::Running => self.running.retain(|&r| r != id),
            SequenceStatus::Waiting => self.waiting.retain(|&r| r != id),
        }
        Some(seq)
    }

    /// Block-manager integrity over every live table, plus the queue/status agreement.
    pub fn check_integrity(&self) -> Result<(), String> {
        self.block_manager
            .check_integrity(self.seqs.values().map(|s| &s.block_table))?;
        if self.running.len() + self.waiting.len() != self.seqs.len() {
            return Err(format!(
                "{} running + {} waiting but {} live sequences",
                self.running.len(),
                self.waiting.len(),
                self.seqs.len()
            ));
        }
        for (ids, status) in [
            (
                self.running.iter().collect::<Vec<_>>(),
                SequenceStatus::Running,
            ),
            (self.waiting.iter().collect(), SequenceStatus::Waiting),
        ] {
            for id in ids {
                let seq = self
                    .seqs
                    .get(id)
                    .ok_or_else(|| format!("queued id {id} is not live"))?;
                if seq.status != status {
                    return Err(format!(
                        "sequence {id} queued as {status:?} but is {:?}",
                        seq.status
                    ));
                }
                if status == SequenceStatus::Waiting
                    && (!seq.block_table.is_empty() || seq.num_computed_tokens != 0)
                {
                    return Err(format!(
                        "waiting sequence {id} holds blocks or computed tokens"
                    ));
                }
                if seq.num_computed_tokens > seq.num_tokens() {
                    return Err(format!(
                        "sequence {id}: {} computed of {} tokens",
                        seq.num_computed_tokens,
                        seq.num_tokens()
                    ));
                }
                let capacity = seq.block_table.len() * self.cfg.block_size;
                if seq.num_computed_tokens > capacity {
                    return Err(format!(
                        "sequence {id}: {} computed tokens in {capacity} slots",
                        seq.num_computed_tokens
                    ));
                }
            }
        }
        Ok(())
    }
}
