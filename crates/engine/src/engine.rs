//! The engine loop, on its own thread: commands in, one step at a time, events out.
//!
//! `step()` = schedule → run the model → sample and postprocess. Around it the loop drains
//! the command channel (Add / Abort / Shutdown) and aborts requests whose stream was dropped
//! (a closed channel). It blocks on the channel only when no request is live.
//!
//! Robustness: requests are validated before they reach this thread; a failing forward pass
//! or an unusable logits row fails only the requests it concerns (each gets one
//! `RequestEvent::Error`) and the loop keeps serving. After `Shutdown`, or once every
//! handle is gone, the loop finishes every live request and exits.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use mlaserve_tokenizer::{DecodeStream, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::handle::Shared;
use crate::metrics::EngineMetrics;
use crate::model_runner::{ModelRunner, StepLogits, StepRows};
use crate::request::{FinishReason, GenerateRequest, RequestEvent, RequestId, TokenLogprob, Usage};
use crate::rng::Rng;
use crate::sampler::{self, Sampled, SamplerError};
use crate::scheduler::Scheduler;
use crate::sequence::Sequence;
use crate::stop::{StopMatch, StopStringMatcher};

/// Messages from handles to the loop.
pub(crate) enum Command {
    Add {
        id: RequestId,
        request: GenerateRequest,
        tx: UnboundedSender<RequestEvent>,
    },
    Abort(RequestId),
    Shutdown,
}

/// The text side of one request: detokenizer, stop strings, and its event channel.
struct OutputState {
    tx: UnboundedSender<RequestEvent>,
    detok: DecodeStream,
    stop: StopStringMatcher,
    /// Still counted in `Shared::num_queued` (never admitted yet).
    is_queued: bool,
}

/// Everything the engine thread owns.
pub(crate) struct EngineLoop {
    pub shared: Arc<Shared>,
    pub cmd_rx: Receiver<Command>,
    pub scheduler: Scheduler,
    pub runner: ModelRunner,
    pub tokenizer: Arc<Tokenizer>,
    pub max_model_len: usize,
    pub seed_rng: Rng,
    outputs: HashMap<RequestId, OutputState>,
    eos_ids: Vec<u32>,
    vocab_size: usize,
    next_arrival: u64,
    is_draining: bool,
    metrics: EngineMetrics,
}

impl EngineLoop {
    pub fn new(
        shared: Arc<Shared>,
        cmd_rx: Receiver<Command>,
        scheduler: Scheduler,
        runner: ModelRunner,
        tokenizer: Arc<Tokenizer>,
        max_model_len: usize,
        seed_rng: Rng,
    ) -> Self {
        let vocab_size = runner.config().vocab_size;
        let eos_ids = tokenizer.eos_ids().to_vec();
        let metrics = EngineMetrics {
            num_cache_blocks_total: scheduler.block_manager().num_total_blocks(),
            ..Default::default()
        };
        Self {
            shared,
            cmd_rx,
            scheduler,
            runner,
            tokenizer,
            max_model_len,
            seed_rng,
            outputs: HashMap::new(),
            eos_ids,
            vocab_size,
            next_arrival: 0,
            is_draining: false,
            metrics,
        }
    }

    /// Runs until shut down (or every handle is dropped) and no request is live.
    pub fn run(mut self) {
        loop {
            if !self.scheduler.has_unfinished() {
                if self.is_draining {
                    break;
                }
                self.publish_metrics();
                match self.cmd_rx.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => break, // every handle dropped and nothing to finish
                }
            }
            loop {
                match self.cmd_rx.try_recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.is_draining = true;
                        break;
                    }
                }
            }
            self.abort_disconnected();
            if self.scheduler.has_unfinished() {
                self.step();
            }
            self.publish_metrics();
        }
        self.publish_metrics();
        tracing::debug!("engine loop exited");
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { id, request, tx } => {
                let seed = self.seed_rng.next_u64();
                let seq = Sequence::new(
                    id,
                    self.next_arrival,
                    request.prompt_tokens,
                    request.params,
                    seed,
                );
                self.next_arrival += 1;
                let output = OutputState {
                    tx,
                    detok: DecodeStream::new(
                        self.tokenizer.clone(),
                        seq.params.skip_special_tokens,
                    ),
                    stop: StopStringMatcher::new(seq.params.stop.clone()),
                    is_queued: true,
                };
                self.outputs.insert(id, output);
                self.scheduler.add(seq);
            }
            Command::Abort(id) => {
                if self.scheduler.seq(id).is_some() {
                    self.finish(id, FinishReason::Abort);
                }
            }
            Command::Shutdown => self.is_draining = true,
        }
    }

    /// Aborts every request whose receiver is gone (the client went away).
    fn abort_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .outputs
            .iter()
            .filter(|(_, o)| o.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.finish(id, FinishReason::Abort);
        }
    }

    /// schedule → run → postprocess.
    fn step(&mut self) {
        let t0 = Instant::now();
        let out = self.scheduler.schedule();
        for id in &out.first_admitted {
            if let Some(o) = self.outputs.get_mut(id) {
                if std::mem::take(&mut o.is_queued) {
                    self.shared.num_queued.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        if out.is_empty() {
            // Cannot happen while one max_model_len sequence fits the cache; never spin hot.
            tracing::warn!(
                waiting = self.scheduler.num_waiting(),
                "nothing schedulable this step"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
            return;
        }
        self.metrics.num_steps += 1;
        // decode: every sequence computes one token past its prompt (a prompt's 1-token
        // last chunk, or the one token a cached prefix leaves, is prefill)
        let decode = out.seqs.iter().all(|s| {
            s.num_new_tokens == 1
                && self
                    .scheduler
                    .seq(s.id)
                    .is_some_and(|q| s.context_len >= q.prompt_len())
        });
        let t1 = Instant::now();
        let run = self.runner.run(&out, &self.scheduler);
        let t2 = Instant::now();
        match run {
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing its requests");
                for s in &out.seqs {
                    self.fail(s.id, format!("forward pass failed: {e}"));
                }
            }
            Ok(step) => {
                self.scheduler.complete_step(&out);
                let sampled = sample_rows(&mut self.scheduler, &step, self.vocab_size);
                for (&id, s) in step.ids.iter().zip(sampled) {
                    if let Some(sampled) = s {
                        self.process_sampled(id, sampled);
                    }
                }
                self.runner.recycle(step);
            }
        }
        let times = if decode {
            &mut self.metrics.decode_steps
        } else {
            &mut self.metrics.prefill_steps
        };
        times.steps += 1;
        times.tokens += out.num_batched_tokens() as u64;
        times.forward_seconds += (t2 - t1).as_secs_f64();
        times.host_seconds += ((t1 - t0) + t2.elapsed()).as_secs_f64();
    }

    /// Takes the token sampled for `id`, emits its text, and finishes the request if it stops.
    fn process_sampled(&mut self, id: RequestId, sampled: Result<Sampled, SamplerError>) {
        let sampled = match sampled {
            Ok(s) => s,
            Err(e) => return self.fail(id, format!("sampling failed: {e}")),
        };
        let Some(seq) = self.scheduler.append_token(id, sampled.token_id) else {
            return;
        };
        if seq.num_output_tokens() == 1 {
            self.metrics.prompt_tokens_total += seq.prompt_len() as u64;
        }
        self.metrics.generation_tokens_total += 1;
        let token_stop = seq.check_token_stop(&self.eos_ids, self.max_model_len);
        match self.emit_text(id, sampled.token_id, token_stop, sampled.logprob) {
            Ok(Some(reason)) => self.finish(id, reason),
            Ok(None) => {}
            Err(msg) => self.fail(id, msg),
        }
    }

    /// Detokenizes, applies stop strings, sends the Token event; returns the finish reason.
    fn emit_text(
        &mut self,
        id: RequestId,
        token_id: u32,
        token_stop: Option<FinishReason>,
        logprob: Option<TokenLogprob>,
    ) -> Result<Option<FinishReason>, String> {
        let tokenizer_vocab = self.tokenizer.vocab_size();
        let Some(o) = self.outputs.get_mut(&id) else {
            return Ok(None);
        };
        let (text, reason) = if token_stop == Some(FinishReason::Stop) {
            // EOS / stop token id: its own text is not part of the output.
            (o.stop.flush(), Some(FinishReason::Stop))
        } else {
            let mut delta = String::new();
            // Ids past the tokenizer's vocabulary (padded embedding rows) have no text.
            if (token_id as usize) < tokenizer_vocab {
                if let Some(d) = o
                    .detok
                    .step(token_id)
                    .map_err(|e| format!("detokenization failed: {e}"))?
                {
                    delta = d;
                }
            }
            if token_stop == Some(FinishReason::Length) {
                delta.push_str(
                    &o.detok
                        .finish()
                        .map_err(|e| format!("detokenization failed: {e}"))?,
                );
            }
            match o.stop.push(&delta) {
                StopMatch::Stopped { release } => (release, Some(FinishReason::Stop)),
                StopMatch::Continue { mut release } if token_stop == Some(FinishReason::Length) => {
                    release.push_str(&o.stop.flush());
                    (release, Some(FinishReason::Length))
                }
                StopMatch::Continue { release } => (release, None),
            }
        };
        // A closed receiver is noticed (and aborted) at the next step.
        let _ = o.tx.send(RequestEvent::Token {
            token_id,
            text,
            logprob,
        });
        Ok(reason)
    }

    /// Ends a request with `reason`: sends `Finished` (if anyone listens) and frees it.
    fn finish(&mut self, id: RequestId, reason: FinishReason) {
        let usage = self.usage(id);
        if let Some(o) = self.outputs.get(&id) {
            let _ = o.tx.send(RequestEvent::Finished { reason, usage });
        }
        match reason {
            FinishReason::Stop => self.metrics.num_finished_stop += 1,
            FinishReason::Length => self.metrics.num_finished_length += 1,
            FinishReason::Abort => self.metrics.num_aborted += 1,
        }
        self.remove(id);
    }

    /// Ends a request with an error event and frees it.
    fn fail(&mut self, id: RequestId, message: String) {
        if let Some(o) = self.outputs.get(&id) {
            let _ = o.tx.send(RequestEvent::Error(message));
        }
        self.metrics.num_failed += 1;
        self.remove(id);
    }

    fn usage(&self, id: RequestId) -> Usage {
        self.scheduler
            .seq(id)
            .map_or_else(Usage::default, |s| Usage {
                prompt_tokens: s.prompt_len(),
                completion_tokens: s.num_output_tokens(),
                cached_prompt_tokens: s.num_cached_prompt_tokens.unwrap_or(0),
            })
    }

    fn remove(&mut self, id: RequestId) {
        self.scheduler.remove(id);
        if let Some(o) = self.outputs.remove(&id) {
            if o.is_queued {
                self.shared.num_queued.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn publish_metrics(&mut self) {
        let bm = self.scheduler.block_manager();
        let stats = self.scheduler.prefix_cache_stats();
        let m = &mut self.metrics;
        m.num_running = self.scheduler.num_running();
        m.num_waiting = self.scheduler.num_waiting();
        m.num_cache_blocks_used = bm.num_used_blocks();
        m.prefix_cache_queries = stats.queries;
        m.prefix_cache_hits = stats.hits;
        m.num_preemptions = self.scheduler.num_preemptions();
        if let Ok(mut shared) = self.shared.metrics.lock() {
            *shared = m.clone();
        }
    }
}

/// Rows from which a step's sampling runs in parallel (rayon): greedy takes ~16 µs a row at a
/// 102,400-token vocabulary on the 2-core build host, temperature sampling ~0.45 ms, so at 64
/// rows the host would hold the GPU's next step for 1 ms (greedy) to ~30 ms; below this, a
/// pool's wake-up costs more than it saves.
const PAR_SAMPLE_ROWS: usize = 4;

/// The next token of each of a step's rows (None: the sequence is gone), the same whether
/// drawn one after another or in parallel: each row draws from a copy of its sequence's random
/// stream, stored back into the sequence afterwards.
fn sample_rows(
    scheduler: &mut Scheduler,
    step: &StepLogits,
    vocab_size: usize,
) -> Vec<Option<Result<Sampled, SamplerError>>> {
    use rayon::prelude::*;
    let shared = &*scheduler;
    let one = |i: usize| {
        let seq = shared.seq(step.ids[i])?;
        let mut rng = seq.rng.clone();
        let sampled = match &step.rows {
            StepRows::Picks { whole_at, .. } if whole_at[i].is_some() => {
                seq.sample_with(step.row(i).expect("a whole row"), vocab_size, &mut rng)
            }
            StepRows::Picks { picks, .. } => {
                let picked = sampler::sample_pick(&picks[i]);
                if picked.is_ok() {
                    // the bits the device drew with (`sample` draws none for a bad row either)
                    seq.params.row_draw(&mut rng);
                }
                picked
            }
            StepRows::Logits(_) => {
                seq.sample_with(step.row(i).expect("a logits row"), vocab_size, &mut rng)
            }
        };
        Some((sampled, rng))
    };
    // whole rows sample on the host: in parallel where there are enough of them (a picked
    // step's whole rows need penalties or logprobs: 0.2-1 ms each, worth a pool from two)
    let parallel = match &step.rows {
        StepRows::Logits(_) => step.ids.len() >= PAR_SAMPLE_ROWS,
        StepRows::Picks { whole_at, .. } => whole_at.iter().flatten().count() >= 2,
    };
    let rows: Vec<_> = if parallel {
        (0..step.ids.len()).into_par_iter().map(one).collect()
    } else {
        (0..step.ids.len()).map(one).collect()
    };
    step.ids
        .iter()
        .zip(rows)
        .map(|(&id, row)| {
            let (sampled, rng) = row?;
            scheduler.seq_mut(id)?.rng = rng;
            Some(sampled)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::SchedulerConfig;
    use crate::SamplingParams;

    fn scheduler(rows: u64) -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 64,
            block_size: 4,
            num_blocks: 64,
            enable_prefix_caching: false,
        });
        for id in 0..rows {
            let params = SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                seed: Some(id),
                ..SamplingParams::greedy(8)
            };
            s.add(Sequence::new(id, id, vec![1, 2, 3], params, 0));
        }
        s
    }

    /// Two steps of 6 rows (parallel) against each sequence sampled alone, step after step:
    /// the same tokens, so each row drew from its own stream and the stream moved on.
    #[test]
    fn a_steps_rows_sample_as_each_sequence_alone() {
        let (rows, vocab) = (6u64, 500);
        assert!(rows as usize >= PAR_SAMPLE_ROWS);
        let mut batched = scheduler(rows);
        let mut alone = scheduler(rows);
        let mut r = Rng::seed_from_u64(3);
        for step in 0..2 {
            let logits: Vec<f32> = (0..rows as usize * vocab)
                .map(|_| r.next_f64() as f32 * 4.0)
                .collect();
            let step_logits = StepLogits {
                ids: (0..rows).collect(),
                rows: StepRows::Logits(logits),
                vocab_size: vocab,
            };
            let got = sample_rows(&mut batched, &step_logits, vocab);
            for id in 0..rows {
                let want = alone
                    .seq_mut(id)
                    .unwrap()
                    .sample_next(step_logits.row(id as usize).unwrap(), vocab)
                    .unwrap();
                let got = got[id as usize].as_ref().unwrap().as_ref().unwrap();
                assert_eq!(got.token_id, want.token_id, "step {step} row {id}");
            }
        }
        // each stream moved on: not where its seed starts it (one draw a step, two steps)
        for id in 0..rows {
            let mut moved = batched.seq(id).unwrap().rng.clone();
            let mut fresh = Rng::seed_from_u64(id);
            assert_ne!(moved.next_u64(), fresh.next_u64(), "row {id}'s stream");
        }
        // a sequence gone since the step was scheduled gets no token (a parallel step)
        let ids = vec![0, 99, 1, 2, 98];
        let step_logits = StepLogits {
            rows: StepRows::Logits(vec![0.0; ids.len() * vocab]),
            ids,
            vocab_size: vocab,
        };
        let got = sample_rows(&mut batched, &step_logits, vocab);
        let some: Vec<bool> = got.iter().map(Option::is_some).collect();
        assert_eq!(some, [true, false, true, true, false]);
    }

    /// A step picked on the device: each row's token — greedy or drawn at a temperature from
    /// its stream, as its whole row samples — the sampler's errors for a row with an unusable
    /// value or nothing above -inf, and no token for a sequence gone since.
    #[test]
    fn a_picked_steps_rows_sample_as_their_whole_rows() {
        use mlaserve_model::{draw::picks_of, RowDraw};
        let temperature = |t: f32| SamplingParams {
            temperature: t,
            ..SamplingParams::greedy(4)
        };
        // greedy x3, temperature x2, then two rows the host samples whole: a penalty at a
        // temperature and greedy with logprobs
        let mut params = [0.0f32, 0.0, 0.0, 0.8, 1.3, 0.9, 0.0].map(temperature);
        params[5].presence_penalty = 0.5;
        params[6].logprobs = Some(2);
        let (mut s, mut whole) = (scheduler(0), scheduler(0));
        for (id, p) in params.iter().enumerate() {
            let id = id as u64;
            s.add(Sequence::new(id, id, vec![1, 2], p.clone(), 7 + id));
            whole.add(Sequence::new(id, id, vec![1, 2], p.clone(), 7 + id));
        }
        let mut r = Rng::seed_from_u64(4);
        let mut rand_row = || (0..4).map(|_| r.next_f64() as f32).collect::<Vec<f32>>();
        let rows: Vec<Vec<f32>> = vec![
            vec![0.5, 3.0, 3.0, -1.0],
            vec![1.0, f32::NAN, 2.0, 0.0],
            vec![f32::NEG_INFINITY; 4],
            rand_row(),
            vec![0.0, 1.0, 0.0, 0.0],
            rand_row(),
            rand_row(),
            rand_row(),
        ];
        let ids = vec![0, 1, 2, 3, 99, 4, 5, 6];
        for step in 0..3 {
            // the runner's draws: as ModelRunner::run builds them
            let draws: Vec<RowDraw> = ids
                .iter()
                .map(
                    |&id| match s.seq(id).filter(|q| q.params.draws_on_device()) {
                        Some(q) => q.params.row_draw(&mut q.rng.clone()),
                        None => RowDraw::Whole,
                    },
                )
                .collect();
            let mut n = 0;
            let whole_at = draws
                .iter()
                .map(|&d| {
                    (d == RowDraw::Whole).then(|| {
                        n += 1;
                        n - 1
                    })
                })
                .collect();
            let (mut picks, mut whole_rows) = (Vec::new(), Vec::new());
            picks_of(&rows.concat(), 4, &draws, &mut picks, &mut whole_rows).unwrap();
            assert_eq!(whole_rows.len(), 3 * 4, "rows 99 (gone), 5 and 6 whole");
            let step_picks = StepLogits {
                ids: ids.clone(),
                rows: StepRows::Picks {
                    picks,
                    whole: whole_rows,
                    whole_at,
                },
                vocab_size: 4,
            };
            let got = sample_rows(&mut s, &step_picks, 4);
            let step_rows = StepLogits {
                ids: ids.clone(),
                rows: StepRows::Logits(rows.concat()),
                vocab_size: 4,
            };
            let want = sample_rows(&mut whole, &step_rows, 4);
            for i in [0, 3, 5, 6, 7] {
                assert_eq!(got[i], want[i], "step {step} row {i}");
            }
            assert!(got[7].clone().unwrap().unwrap().logprob.is_some());
            assert_eq!(got[0].clone().unwrap().unwrap().token_id, 1);
            assert!(matches!(
                got[1].clone().unwrap(),
                Err(SamplerError::NonFinite { index: 1, value }) if value.is_nan()
            ));
            assert_eq!(got[2].clone().unwrap(), Err(SamplerError::AllMasked));
            assert!(got[4].is_none(), "sequence 99 is gone");
        }
        // the temperature rows' streams moved on together: one draw a step
        for id in [3, 4, 5] {
            let (a, b) = (&s.seq(id).unwrap().rng, &whole.seq(id).unwrap().rng);
            assert_eq!(
                a.clone().next_u64(),
                b.clone().next_u64(),
                "row {id}'s stream"
            );
        }
    }
}
