//! [`run`]: a forward pass with rayon's other workers kept spinning between its products.
//!
//! A decode step is a chain of small products (about ten fork-joins a layer). Between them
//! rayon's workers go to sleep and are woken by a futex (on a VM, an interrupt to a halted
//! vCPU): in a 2-thread decode of the CPU bench model each worker sat idle 14% of the step and
//! spent another ~9% in the scheduler. Inside `run(f)`, the other workers are recruited into a
//! loop that takes [`crate::matmul_batch`]'s tiles the moment they are published and otherwise
//! runs pending rayon work (`rayon::yield_now`), so the parallel iterators `f` uses elsewhere
//! still spread over them. Outside a team, products fork-join on rayon as before.
//!
//! Invariants:
//! - which thread runs a tile never changes a result (tiles write disjoint outputs, each with
//!   its own fixed arithmetic), so results are bit for bit those without a team;
//! - the publishing thread takes tiles itself until none is left, so progress never waits for
//!   a helper to arrive; it returns only when every tile is done and no helper still holds
//!   the job (`busy == 0` after the job is retired);
//! - helpers leave when `run` returns (also by unwinding); a helper that starts late sees the
//!   team stopped and returns at once; a leader never becomes a helper;
//! - no thread waits, under a helper loop, for work of the team it helps: a team takes helpers
//!   only until its work starts (`closed`; a helper job still queued then returns at once when
//!   some thread, perhaps one waiting in a join of this team's work, runs it), a thread
//!   already helping never starts a second helper loop, and there is one team at a time in
//!   the process (a concurrent forward runs without one; two teams could each hold the
//!   other's helper under a frame it waits on);
//! - a plain forward running next to a team can pick up a queued helper job while it waits in
//!   a join and then waits for the team's forward to end: correct, slower; only concurrent
//!   forwards (tests, `doctor` beside serving) meet it. `MLASERVE_NO_TEAM` turns teams off.

use std::any::Any;
use std::cell::Cell;
use std::panic::resume_unwind;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};

/// One published loop: `run(i)` for `i` in `0..n`.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    n: usize,
    /// Threads that may take indices: a claim takes `1 / (2 * threads)` of the indices left
    /// (guided scheduling: large claims first, single indices at the end, so no thread is
    /// still on a large claim when the others run out; each claim and each thread's count
    /// of finished indices is one contended atomic).
    threads: usize,
    /// The next index to take (reaches `n` once every index is taken).
    next: AtomicUsize,
    /// Indices finished.
    done: AtomicUsize,
    /// The first panic of an index, re-raised on the leader.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// A team's state, shared by its thread and its helpers.
#[derive(Default)]
struct Team {
    stop: AtomicBool,
    /// The published job, or null.
    job: AtomicPtr<Job<'static>>,
    /// Helpers that may be reading `job`'s target.
    busy: AtomicUsize,
    /// Helper jobs that have started, and whether the team stopped taking helpers: one that
    /// starts later (it waited in a queue while its worker was busy, and may now run nested
    /// under a join of this team's own work) returns at once instead of spinning under it.
    started: AtomicUsize,
    closed: AtomicBool,
    /// Bumped as each job is published: a helper that drained one waits for the next
    /// instead of touching the drained job's counters (consecutive jobs share an address).
    generation: AtomicU64,
}

/// How long a new team waits for its helper jobs to start before closing to late ones.
const HELPER_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// Whether some thread leads a team.
static ACTIVE: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The team this thread leads, or null.
    static LEADS: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread is in a helper loop (a nested one would never return to the index
    /// it interrupted).
    static HELPING: Cell<bool> = const { Cell::new(false) };
}

/// Whether teams are off (`MLASERVE_NO_TEAM` set): every product then fork-joins on rayon.
fn disabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("MLASERVE_NO_TEAM").is_some())
}

/// Run `f` with the other rayon workers spinning as helpers for its products (see the
/// module doc). Runs `f` plainly where rayon has one thread, this thread already leads a
/// team, or another thread does. Call it on a rayon worker: with the leader outside the pool
/// (one more thread than workers) a 2-thread decode measured no gain, on a worker 1.15x.
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 || disabled() || !LEADS.with(Cell::get).is_null() {
        return f();
    }
    // One team at a time in the process: a second concurrent forward runs plainly.
    if ACTIVE.swap(true, SeqCst) {
        return f();
    }
    /// Stops the team and forgets it however `f` ends.
    struct End(Arc<Team>);
    impl Drop for End {
        fn drop(&mut self) {
            self.0.stop.store(true, SeqCst);
            LEADS.with(|c| c.set(std::ptr::null()));
            ACTIVE.store(false, SeqCst);
        }
    }
    let end = End(Arc::new(Team::default()));
    for _ in 0..helpers {
        let t = Arc::clone(&end.0);
        rayon::spawn(move || help(&t));
    }
    // Idle workers take their helper job within microseconds; a busy one's job is closed
    // before any work of this team exists, so it can never start under one of its joins.
    let t0 = std::time::Instant::now();
    while end.0.started.load(SeqCst) < helpers && t0.elapsed() < HELPER_WAIT {
        std::hint::spin_loop();
    }
    end.0.closed.store(true, SeqCst);
    LEADS.with(|c| c.set(Arc::as_ptr(&end.0)));
    f()
}

/// `f(i)` for `i` in `0..n` on this thread's team, returning `false` (having run nothing)
/// where this thread leads none. A panic in `f` is re-raised here once no thread runs `f`.
pub(crate) fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
    let team = LEADS.with(Cell::get);
    if team.is_null() {
        return false;
    }
    // SAFETY: `run` holds the team's Arc on this thread's stack while LEADS points at it.
    let team = unsafe { &*team };
    let threads = rayon::current_num_threads().max(1);
    let job = Job {
        run: f,
        n,
        threads,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    debug_assert!(
        team.job.load(SeqCst).is_null(),
        "for_each nested on a leader"
    );
    team.generation.fetch_add(1, SeqCst);
    // Lifetime erased: helpers only dereference it between `busy` increments that this
    // function waits out below, before `job` goes out of scope.
    team.job
        .store(&job as *const Job<'_> as *mut Job<'static>, SeqCst);
    work(&job);
    while job.done.load(SeqCst) < n {
        std::hint::spin_loop();
    }
    team.job.store(std::ptr::null_mut(), SeqCst);
    while team.busy.load(SeqCst) != 0 {
        std::hint::spin_loop();
    }
    let payload = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = payload {
        resume_unwind(p);
    }
    true
}

/// `(0..n).map(f)` collected in order: on this thread's team where it leads one, else as a
/// rayon parallel iterator. For a forward's parallel loops other than products (attention
/// heads): inside a team a rayon iterator would wake a sleeping worker, which then spins in
/// rayon's idle loop against the team for a while.
pub fn par_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    use rayon::prelude::*;
    if LEADS.with(Cell::get).is_null() {
        return (0..n).into_par_iter().map(f).collect();
    }
    let mut out: Vec<std::mem::MaybeUninit<T>> = Vec::with_capacity(n);
    /// The slots' base, shared by the threads that write disjoint slots.
    struct Slots<T>(*mut std::mem::MaybeUninit<T>);
    // SAFETY: each index is written by exactly one thread (`for_each` runs each once), and
    // the writes finish before `for_each` returns.
    unsafe impl<T: Send> Sync for Slots<T> {}
    let slots = Slots(out.as_mut_ptr());
    let write = |i: usize| {
        let v = f(i);
        let s = &slots;
        // SAFETY: i < n = capacity; see `Slots`.
        unsafe { s.0.add(i).write(std::mem::MaybeUninit::new(v)) };
    };
    if !for_each(n, &write) {
        unreachable!("this thread leads a team");
    }
    // SAFETY: every slot 0..n was written (a panic in `f` re-raises in `for_each` before
    // this line; the written slots then leak, none is read); MaybeUninit<T> has T's layout.
    let mut out = std::mem::ManuallyDrop::new(out);
    unsafe { Vec::from_raw_parts(out.as_mut_ptr() as *mut T, n, out.capacity()) }
}

/// Take indices of `job`, a share of those left at a time, until none is left; count them
/// done once.
fn work(job: &Job) {
    let mut finished = 0;
    let mut i0 = job.next.load(SeqCst);
    while i0 < job.n {
        let c = ((job.n - i0) / (2 * job.threads)).max(1);
        if let Err(now) = job.next.compare_exchange_weak(i0, i0 + c, SeqCst, SeqCst) {
            i0 = now;
            continue;
        }
        for i in i0..i0 + c {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| (job.run)(i))) {
                let mut first = job.panic.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert(p);
            }
            finished += 1;
        }
        i0 = job.next.load(SeqCst);
    }
    if finished > 0 {
        job.done.fetch_add(finished, SeqCst);
    }
}

/// A helper's loop: published jobs first, other rayon work while none is, until the team
/// stops. After ~2^14 idle turns it also yields the core to the OS scheduler each turn, for
/// machines with more runnable threads than cores.
fn help(team: &Team) {
    // A leader (popping its own queued helper job while it waits on a join) never helps, nor
    // does a thread already helping (an index that joins could otherwise steal a queued
    // helper job and never return to the index the leader waits for).
    if !LEADS.with(Cell::get).is_null() || HELPING.with(|h| h.replace(true)) {
        return;
    }
    team.started.fetch_add(1, SeqCst);
    if team.closed.load(SeqCst) {
        HELPING.with(|h| h.set(false));
        return;
    }
    let mut drained = 0u64;
    let mut idle = 0u32;
    while !team.stop.load(SeqCst) {
        let generation = team.generation.load(SeqCst);
        if generation == drained || team.job.load(SeqCst).is_null() {
            // Other rayon work now and then: stealing touches the deques the leader uses.
            idle = idle.saturating_add(1);
            if idle & 31 == 0 {
                rayon::yield_now();
            }
            if idle > 1 << 14 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        idle = 0;
        team.busy.fetch_add(1, SeqCst);
        // Re-read under `busy`: the leader retires a job before waiting for `busy` to drain,
        // so a job read now stays alive until the decrement.
        let p = team.job.load(SeqCst);
        if !p.is_null() {
            // SAFETY: see above.
            work(unsafe { &*p });
        }
        team.busy.fetch_sub(1, SeqCst);
        drained = generation;
    }
    HELPING.with(|h| h.set(false));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    /// One team at a time in the process: these tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn every_index_runs_once_inside_and_outside_a_team() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            let hits: Vec<AtomicU64> = (0..1000).map(|_| AtomicU64::new(0)).collect();
            let f = |i: usize| {
                hits[i].fetch_add(1, SeqCst);
            };
            assert!(!for_each(1000, &f), "no team outside run");
            run(|| {
                for _ in 0..50 {
                    assert!(for_each(1000, &f));
                }
                // Nested parallel iterators still complete inside a team.
                use rayon::prelude::*;
                let s: u64 = (0..10_000u64).into_par_iter().sum();
                assert_eq!(s, 10_000 * 9_999 / 2);
                let v = par_map(1000, |i| vec![i; i % 7]);
                assert!(v.iter().enumerate().all(|(i, x)| *x == vec![i; i % 7]));
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 50));
            let v = par_map(1000, |i| vec![i; i % 7]);
            assert!(v.iter().enumerate().all(|(i, x)| *x == vec![i; i % 7]));
        });
    }

    #[test]
    fn an_index_that_joins_never_strands_the_leader() {
        // One worker busy as the team starts, so a helper job stays queued; an index that
        // runs a parallel iterator may then steal it while it waits, and must not enter a
        // second helper loop (it would never return to the index the leader waits for).
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        use rayon::prelude::*;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let nap = || std::thread::sleep(std::time::Duration::from_micros(20));
        for _ in 0..4 {
            pool.install(|| {
                rayon::spawn(|| std::thread::sleep(std::time::Duration::from_millis(2)));
                std::thread::sleep(std::time::Duration::from_micros(300));
                run(|| {
                    for _ in 0..4 {
                        assert!(for_each(8, &|_| {
                            let s: u64 = (0..64u64).into_par_iter().inspect(|_| nap()).sum();
                            assert_eq!(s, 64 * 63 / 2);
                        }));
                    }
                });
            });
        }
    }

    #[test]
    fn a_panicking_index_is_raised_on_the_leader() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let r = pool.install(|| {
            catch_unwind(|| {
                run(|| {
                    for_each(64, &|i| assert!(i != 40, "index 40"));
                })
            })
        });
        assert!(r.is_err());
        // The pool still works afterwards.
        pool.install(|| run(|| assert!(for_each(8, &|_| {}))));
    }
}
