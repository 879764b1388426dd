//! Collectives between tensor-parallel ranks: the [`Communicator`] trait and [`ThreadComm`],
//! N ranks on threads of one process.
//!
//! Invariants:
//! - every rank calls the same collectives in the same order with the same lengths; a rank
//!   that calls a different one (or another length or root) fails the group with an error
//!   naming both calls, it never reads a buffer of the wrong size;
//! - `all_reduce_sum` adds the ranks' buffers in rank order (`((r0 + r1) + r2) + ...`) and every
//!   rank receives the same bits, so replicated state (the residual stream, the latent cache,
//!   the DSA top-k) stays identical on every rank;
//! - no collective waits forever: past the group's timeout it fails the group and returns
//!   [`CommError::Timeout`] naming the ranks it waited for; once any rank fails the group
//!   (timeout, mismatch, or [`Communicator::abort`] after its own error or panic) every
//!   collective of every rank returns [`CommError::Aborted`] at once, naming the failed rank,
//!   until [`ThreadComm::reset`].

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default time a collective waits for its peers.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a collective failed. Every variant names the rank that saw it and the collective.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The peers did not all arrive within the timeout.
    #[error(
        "rank {rank}: {collective} timed out after {waited:?} waiting for rank(s) {missing:?}"
    )]
    Timeout {
        rank: usize,
        collective: &'static str,
        waited: Duration,
        missing: Vec<usize>,
    },
    /// Another rank failed the group (or this one did, earlier).
    #[error("rank {rank}: {collective} aborted: rank {failed_rank} failed: {reason}")]
    Aborted {
        rank: usize,
        collective: &'static str,
        failed_rank: usize,
        reason: String,
    },
    /// The ranks disagree on the call (collective, length or root), or a buffer has the wrong
    /// length for the call.
    #[error("rank {rank}: {collective}: {msg}")]
    Mismatch {
        rank: usize,
        collective: &'static str,
        msg: String,
    },
}

impl CommError {
    /// Whether this error only reports another rank's failure (not a root cause).
    pub fn is_peer_failure(&self, rank: usize) -> bool {
        matches!(self, CommError::Aborted { failed_rank, .. } if *failed_rank != rank)
    }
}

/// Collectives over `world_size` ranks. All ranks must call the same collectives in the same
/// order with buffers of the same length.
pub trait Communicator: Send + Sync {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Element-wise sum of `buf` over all ranks, written back into every rank's `buf`.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError>;
    /// Every rank's `send` concatenated in rank order into `recv` (`world_size * send.len()`).
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError>;
    /// Rank `root`'s `buf` copied into every rank's `buf`.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Fail the group: every pending and later collective of every rank returns
    /// [`CommError::Aborted`] naming this rank and `reason`. The first failure wins.
    fn abort(&self, reason: &str);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduceSum,
    AllGather,
    Broadcast,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduceSum => "all_reduce_sum",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
        }
    }
}

/// What a round is: the collective, the per-rank length, the root (broadcast).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    op: Op,
    len: usize,
    root: usize,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op {
            Op::Broadcast => write!(f, "broadcast(len {}, root {})", self.len, self.root),
            op => write!(f, "{}(len {})", op.name(), self.len),
        }
    }
}

#[derive(Debug, Clone)]
struct Failure {
    rank: usize,
    reason: String,
}

struct State {
    /// Completed rounds; a waiter is done when this moves past the round it joined.
    generation: u64,
    /// The current round's call (set by its first arrival) and who set it.
    call: Option<(Call, usize)>,
    /// [world] each rank's input to the current round.
    inputs: Vec<Option<Vec<f32>>>,
    /// The last completed round's output (every rank copies it before the next round can
    /// complete, because completing needs every rank to arrive again).
    result: Arc<Vec<f32>>,
    failure: Option<Failure>,
}

struct Group {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record the first failure and wake every waiter.
    fn fail(&self, st: &mut State, rank: usize, reason: String) {
        if st.failure.is_none() {
            st.failure = Some(Failure { rank, reason });
        }
        self.cv.notify_all();
    }
}

/// One rank's handle on a group of in-process ranks (threads). Cheap to clone; clones are the
/// same rank.
#[derive(Clone)]
pub struct ThreadComm {
    rank: usize,
    group: Arc<Group>,
}

impl ThreadComm {
    /// A group of `world_size` ranks (handle `i` is rank `i`) whose collectives wait at most
    /// `timeout` for their peers.
    ///
    /// # Panics
    /// If `world_size == 0`.
    pub fn group(world_size: usize, timeout: Duration) -> Vec<ThreadComm> {
        assert!(
            world_size > 0,
            "a communicator group needs at least one rank"
        );
        let group = Arc::new(Group {
            world: world_size,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                call: None,
                inputs: vec![None; world_size],
                result: Arc::new(Vec::new()),
                failure: None,
            }),
            cv: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| ThreadComm {
                rank,
                group: group.clone(),
            })
            .collect()
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.group.timeout
    }

    /// The failure that stopped the group, if any: (failed rank, reason).
    pub fn failure(&self) -> Option<(usize, String)> {
        self.group
            .lock()
            .failure
            .as_ref()
            .map(|f| (f.rank, f.reason.clone()))
    }

    /// Clear a failure and any half-joined round so the group can run again.
    ///
    /// Precondition: no rank is inside a collective (the caller has collected every rank's
    /// result for the step). A rank still waiting would otherwise see its round vanish.
    pub fn reset(&self) {
        let mut st = self.group.lock();
        st.failure = None;
        st.call = None;
        st.inputs.iter_mut().for_each(|i| *i = None);
        st.generation += 1;
    }

    /// Join the current round with `input`; returns the round's output once every rank has
    /// joined. The last rank to arrive computes the output.
    fn round(&self, call: Call, input: Vec<f32>) -> Result<Arc<Vec<f32>>, CommError> {
        let (g, rank, name) = (&*self.group, self.rank, call.op.name());
        let aborted = |f: &Failure| CommError::Aborted {
            rank,
            collective: name,
            failed_rank: f.rank,
            reason: f.reason.clone(),
        };
        let mut st = g.lock();
        if let Some(f) = &st.failure {
            return Err(aborted(f));
        }
        match st.call {
            None => st.call = Some((call, rank)),
            Some((c, first)) if c != call => {
                let msg = format!("rank {rank} called {call} while rank {first} called {c}");
                g.fail(&mut st, rank, msg.clone());
                return Err(CommError::Mismatch {
                    rank,
                    collective: name,
                    msg,
                });
            }
            Some(_) => {}
        }
        if st.inputs[rank].is_some() {
            let msg = format!("rank {rank} joined the same {call} round twice");
            g.fail(&mut st, rank, msg.clone());
            return Err(CommError::Mismatch {
                rank,
                collective: name,
                msg,
            });
        }
        st.inputs[rank] = Some(input);
        let gen = st.generation;
        if st.inputs.iter().all(Option::is_some) {
            let inputs: Vec<Vec<f32>> = st.inputs.iter_mut().filter_map(Option::take).collect();
            let out = match call.op {
                Op::AllReduceSum => {
                    let mut acc = inputs[0].clone();
                    for other in &inputs[1..] {
                        for (a, b) in acc.iter_mut().zip(other) {
                            *a += b;
                        }
                    }
                    acc
                }
                Op::AllGather => inputs.concat(),
                Op::Broadcast => inputs[call.root].clone(),
            };
            let out = Arc::new(out);
            st.result = out.clone();
            st.call = None;
            st.generation += 1;
            g.cv.notify_all();
            return Ok(out);
        }
        let start = Instant::now();
        let deadline = start + g.timeout;
        loop {
            if st.generation != gen {
                return Ok(st.result.clone());
            }
            if let Some(f) = &st.failure {
                return Err(aborted(f));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> =
                    (0..g.world).filter(|&r| st.inputs[r].is_none()).collect();
                let err = CommError::Timeout {
                    rank,
                    collective: name,
                    waited: now - start,
                    missing,
                };
                g.fail(&mut st, rank, err.to_string());
                return Err(err);
            }
            st =
                g.cv.wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
        }
    }

    /// Fail the group because this rank got a bad argument, and return the error.
    fn reject(&self, op: Op, msg: String) -> CommError {
        let mut st = self.group.lock();
        self.group.fail(&mut st, self.rank, msg.clone());
        CommError::Mismatch {
            rank: self.rank,
            collective: op.name(),
            msg,
        }
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.world
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        if self.group.world == 1 {
            return Ok(());
        }
        let call = Call {
            op: Op::AllReduceSum,
            len: buf.len(),
            root: 0,
        };
        let out = self.round(call, buf.to_vec())?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        if recv.len() != send.len() * self.group.world {
            return Err(self.reject(
                Op::AllGather,
                format!(
                    "recv holds {} values, expected {} ranks x {}",
                    recv.len(),
                    self.group.world,
                    send.len()
                ),
            ));
        }
        let call = Call {
            op: Op::AllGather,
            len: send.len(),
            root: 0,
        };
        let out = self.round(call, send.to_vec())?;
        recv.copy_from_slice(&out);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        if root >= self.group.world {
            return Err(self.reject(
                Op::Broadcast,
                format!("root {root} outside 0..{}", self.group.world),
            ));
        }
        let call = Call {
            op: Op::Broadcast,
            len: buf.len(),
            root,
        };
        let input = if self.rank == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        let out = self.round(call, input)?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    fn abort(&self, reason: &str) {
        let mut st = self.group.lock();
        self.group.fail(&mut st, self.rank, reason.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// Run `f(comm)` on one thread per rank; results in rank order.
    fn on_ranks<T: Send + 'static>(
        world: usize,
        timeout: Duration,
        f: impl Fn(ThreadComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = ThreadComm::group(world, timeout)
            .into_iter()
            .map(|c| {
                let f = f.clone();
                thread::spawn(move || f(c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_sums_in_rank_order_with_identical_bits() {
        for world in [1, 2, 3, 4] {
            let out = on_ranks(world, DEFAULT_TIMEOUT, |c| {
                let mut rounds = Vec::new();
                for round in 0..50 {
                    // Values whose sum depends on the order: 1e8 + small parts.
                    let mut buf: Vec<f32> = (0..7)
                        .map(|i| {
                            if c.rank() == 0 {
                                1e8
                            } else {
                                (c.rank() * 3 + i + round) as f32 * 0.37
                            }
                        })
                        .collect();
                    c.all_reduce_sum(&mut buf).unwrap();
                    rounds.push(buf);
                }
                rounds
            });
            for (round, _) in out[0].iter().enumerate() {
                let want: Vec<f32> = (0..7)
                    .map(|i| {
                        let mut acc = 1e8f32;
                        for r in 1..world {
                            acc += (r * 3 + i + round) as f32 * 0.37;
                        }
                        acc
                    })
                    .collect();
                for (r, rounds) in out.iter().enumerate() {
                    assert_eq!(rounds[round], want, "world {world} rank {r} round {round}");
                }
            }
        }
    }

    #[test]
    fn all_gather_and_broadcast() {
        let out = on_ranks(3, DEFAULT_TIMEOUT, |c| {
            let send = [c.rank() as f32, 10.0 + c.rank() as f32];
            let mut recv = [0f32; 6];
            c.all_gather(&send, &mut recv).unwrap();
            let mut b = [c.rank() as f32; 4];
            c.broadcast(&mut b, 2).unwrap();
            (recv, b)
        });
        for (recv, b) in out {
            assert_eq!(recv, [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
            assert_eq!(b, [2.0; 4]);
        }
    }

    #[test]
    fn a_missing_rank_times_out_naming_it() {
        let t0 = Instant::now();
        let out = on_ranks(3, Duration::from_millis(150), |c| {
            if c.rank() == 2 {
                return Ok(()); // never joins
            }
            c.all_reduce_sum(&mut [1.0; 4])
        });
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        let errs: Vec<CommError> = out[..2].iter().map(|r| r.clone().unwrap_err()).collect();
        // One rank times out first and fails the group; the other either times out too or
        // is aborted by the first, naming it.
        let timeouts: Vec<&CommError> = errs
            .iter()
            .filter(|e| matches!(e, CommError::Timeout { .. }))
            .collect();
        assert!(!timeouts.is_empty(), "{errs:?}");
        match timeouts[0] {
            CommError::Timeout {
                missing,
                collective,
                ..
            } => {
                assert_eq!(missing, &vec![2]);
                assert_eq!(*collective, "all_reduce_sum");
            }
            _ => unreachable!(),
        }
        assert!(errs[0].to_string().starts_with("rank 0: all_reduce_sum"));
    }

    #[test]
    fn a_failing_rank_stops_the_others_at_once_with_its_reason() {
        let t0 = Instant::now();
        let out = on_ranks(4, Duration::from_secs(30), |c| {
            let mut buf = [1.0f32; 8];
            c.all_reduce_sum(&mut buf)?;
            if c.rank() == 3 {
                c.abort("rank 3 ran out of memory");
                return Ok(buf[0]);
            }
            c.all_reduce_sum(&mut buf)?;
            Ok(buf[0])
        });
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "waited for the timeout: {:?}",
            t0.elapsed()
        );
        for (r, res) in out.iter().enumerate().take(3) {
            match res {
                Err(CommError::Aborted {
                    rank,
                    failed_rank: 3,
                    reason,
                    ..
                }) => {
                    assert_eq!(*rank, r);
                    assert!(reason.contains("out of memory"));
                }
                other => panic!("rank {r}: {other:?}"),
            }
        }
    }

    #[test]
    fn mismatched_calls_fail_every_rank() {
        let out = on_ranks(2, Duration::from_secs(30), |c| {
            if c.rank() == 0 {
                c.all_reduce_sum(&mut [0.0; 4])
            } else {
                c.all_reduce_sum(&mut [0.0; 5])
            }
        });
        let msgs: Vec<String> = out
            .iter()
            .map(|r| r.clone().unwrap_err().to_string())
            .collect();
        assert!(
            msgs.iter().any(|m| m.contains("all_reduce_sum(len 5)")
                && m.contains("all_reduce_sum(len 4)")),
            "{msgs:?}"
        );
    }

    #[test]
    fn reset_makes_a_failed_group_usable_again() {
        let comms = ThreadComm::group(2, Duration::from_secs(30));
        comms[1].abort("boom");
        assert!(comms[0].all_reduce_sum(&mut [1.0]).is_err());
        assert_eq!(comms[0].failure(), Some((1, "boom".to_string())));
        comms[0].reset();
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                thread::spawn(move || {
                    let mut b = [c.rank() as f32 + 1.0];
                    c.all_reduce_sum(&mut b).map(|_| b[0])
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), Ok(3.0));
        }
    }
}
