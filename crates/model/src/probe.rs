//! Named tensor probes: `--trace GLOB[:N]`, `--dump DIR`, and in-process capture for `doctor`.
//!
//! Probe points are always compiled in; when nothing is configured a probe costs one relaxed
//! atomic load. Names are `L{layer}.{point}` (`L3.mla.q_lat`) or a bare point (`logits`).
//! Invariants:
//! - a trace line goes straight to stderr with one `write_all` (stderr is unbuffered), so it
//!   survives a crash that follows it; every line carries the rank;
//! - only the first N hits of each matching probe name print (N = 8 by default), counted per
//!   rank, so every tensor-parallel rank reports;
//! - a step's number is that of the `begin_step` on the same thread; tensor-parallel workers
//!   number their steps themselves (`set_next_step`), so all ranks agree on it, and each rank's
//!   `end_step` writes only its own records;
//! - captured records keep the tensor, its shape, the attention path and the token positions;
//! - an in-process capture (`start_capture`) belongs to the calling thread, so concurrent
//!   captures (tests, several doctors) never see each other's records. Probes fire on the thread
//!   that called `Model::forward` (whose step runs on a rayon worker carrying that thread's
//!   probe state there and back: `swap_thread_state`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Threads with an in-process capture running.
static CAPTURES: AtomicUsize = AtomicUsize::new(0);
static STEP: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static RANK: Cell<usize> = const { Cell::new(0) };
    /// The step this thread is running (set by `begin_step`).
    static CUR_STEP: Cell<u64> = const { Cell::new(0) };
    /// The number the next `begin_step` on this thread takes (None: the process counter).
    static NEXT_STEP: Cell<Option<u64>> = const { Cell::new(None) };
    static POSITIONS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    static CAPTURE: RefCell<Option<(Vec<String>, Vec<Record>)>> = const { RefCell::new(None) };
}

/// Which attention formulation produced a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathTag {
    /// Not attention-specific.
    None,
    /// Unabsorbed prefill.
    Mha,
    /// Absorbed decode over the latent cache.
    Mqa,
    /// New tokens over cached context, LSE-merged.
    Context,
}

impl PathTag {
    pub fn as_str(self) -> &'static str {
        match self {
            PathTag::None => "-",
            PathTag::Mha => "mha",
            PathTag::Mqa => "mqa",
            PathTag::Context => "context",
        }
    }
}

/// One captured tensor.
#[derive(Debug, Clone)]
pub struct Record {
    pub name: String,
    pub step: u64,
    pub rank: usize,
    pub path: PathTag,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub positions: Vec<usize>,
}

/// Summary statistics printed by a trace line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub l2: f64,
    pub mean: f64,
    pub absmax: f32,
    pub nan: usize,
    pub inf: usize,
}

impl Stats {
    pub fn of(data: &[f32]) -> Stats {
        let (mut sq, mut sum, mut absmax, mut nan, mut inf) = (0f64, 0f64, 0f32, 0, 0);
        for &x in data {
            if x.is_nan() {
                nan += 1;
            } else if x.is_infinite() {
                inf += 1;
            } else {
                sq += (x as f64) * (x as f64);
                sum += x as f64;
                absmax = absmax.max(x.abs());
            }
        }
        Stats {
            l2: sq.sqrt(),
            mean: if data.is_empty() {
                0.0
            } else {
                sum / data.len() as f64
            },
            absmax,
            nan,
            inf,
        }
    }
}

#[derive(Default)]
struct State {
    trace: Vec<String>,
    trace_limit: usize,
    /// (rank, probe name) -> lines printed.
    hits: HashMap<(usize, String), usize>,
    capture: Vec<String>,
    records: Vec<Record>,
    dump_dir: Option<PathBuf>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Glob match with `*` (any run) and `?` (one char).
pub fn glob_match(pat: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(sp) = star {
            pi = sp + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Parse `GLOB[,GLOB...][:N]`.
pub fn parse_spec(spec: &str) -> (Vec<String>, usize) {
    let (globs, n) = match spec.rsplit_once(':') {
        Some((g, n)) if n.parse::<usize>().is_ok() => (g, n.parse().unwrap_or(8)),
        _ => (spec, 8),
    };
    (
        globs
            .split(',')
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .collect(),
        n,
    )
}

/// Configure tracing (stderr lines) and dumping (safetensors per step). `None` leaves a part off.
pub fn configure(trace: Option<&str>, dump: Option<(PathBuf, &str)>) {
    let mut st = State::default();
    if let Some(spec) = trace {
        let (globs, n) = parse_spec(spec);
        st.trace = globs;
        st.trace_limit = n;
    }
    if let Some((dir, spec)) = dump {
        st.capture = parse_spec(spec).0;
        st.dump_dir = Some(dir);
    }
    let on = !st.trace.is_empty() || !st.capture.is_empty();
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(st);
    ACTIVE.store(on, Ordering::Release);
}

/// Start capturing matching probes of this thread in memory (for `doctor` and tests).
pub fn start_capture(glob: &str) {
    CAPTURE.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            CAPTURES.fetch_add(1, Ordering::AcqRel);
        }
        *c = Some((parse_spec(glob).0, Vec::new()));
    });
}

/// Stop this thread's capture and take its records.
pub fn take_capture() -> Vec<Record> {
    CAPTURE.with(|c| match c.borrow_mut().take() {
        Some((_, records)) => {
            CAPTURES.fetch_sub(1, Ordering::AcqRel);
            records
        }
        None => Vec::new(),
    })
}

/// A thread's probe state (rank, step numbers, positions, capture), moved with a step that
/// runs on another thread (`Model::forward` runs on a rayon worker) and back.
#[derive(Default)]
pub(crate) struct ThreadState {
    rank: usize,
    cur_step: u64,
    next_step: Option<u64>,
    positions: Vec<usize>,
    capture: Option<(Vec<String>, Vec<Record>)>,
}

/// Install `s` as this thread's probe state and return the state it replaces. A step moved to
/// a worker swaps its state in and the worker's own back out: the worker may be in the middle
/// of another forward (waiting in a join), whose state must survive.
pub(crate) fn swap_thread_state(s: ThreadState) -> ThreadState {
    ThreadState {
        rank: RANK.with(|r| r.replace(s.rank)),
        cur_step: CUR_STEP.with(|c| c.replace(s.cur_step)),
        next_step: NEXT_STEP.with(|n| n.replace(s.next_step)),
        positions: POSITIONS.with(|p| std::mem::replace(&mut *p.borrow_mut(), s.positions)),
        capture: CAPTURE.with(|c| std::mem::replace(&mut *c.borrow_mut(), s.capture)),
    }
}

/// This thread's probe state, leaving the defaults.
pub(crate) fn take_thread_state() -> ThreadState {
    swap_thread_state(ThreadState::default())
}

/// Whether any probe is live.
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed) || CAPTURES.load(Ordering::Relaxed) > 0
}

/// Set this thread's rank (tensor-parallel workers).
pub fn set_rank(rank: usize) {
    RANK.with(|r| r.set(rank));
}

/// This thread's rank.
pub fn rank() -> usize {
    RANK.with(|r| r.get())
}

/// Make the next [`begin_step`] on this thread take number `step` instead of the next value of
/// the process-wide counter (tensor-parallel workers: every rank gives a step the same number).
pub fn set_next_step(step: u64) {
    NEXT_STEP.with(|n| n.set(Some(step)));
}

/// Mark the start of a forward step with its token positions; returns the step number.
pub fn begin_step(positions: &[usize]) -> u64 {
    let step = NEXT_STEP
        .with(Cell::take)
        .unwrap_or_else(|| STEP.fetch_add(1, Ordering::Relaxed));
    CUR_STEP.with(|c| c.set(step));
    if active() {
        POSITIONS.with(|p| {
            let mut p = p.borrow_mut();
            p.clear();
            p.extend_from_slice(positions);
        });
    }
    step
}

/// Record a tensor at probe point `point` of `layer` (None for model-level probes).
#[inline]
pub fn probe(layer: Option<usize>, point: &str, path: PathTag, shape: &[usize], data: &[f32]) {
    if active() {
        probe_slow(layer, point, path, shape, data);
    }
}

#[cold]
fn probe_slow(layer: Option<usize>, point: &str, path: PathTag, shape: &[usize], data: &[f32]) {
    let name = match layer {
        Some(l) => format!("L{l}.{point}"),
        None => point.to_string(),
    };
    let step = CUR_STEP.with(Cell::get);
    let rank = rank();
    let positions = || POSITIONS.with(|p| p.borrow().clone());
    CAPTURE.with(|c| {
        if let Some((globs, records)) = c.borrow_mut().as_mut() {
            if globs.iter().any(|p| glob_match(p, &name)) {
                records.push(Record {
                    name: name.clone(),
                    step,
                    rank,
                    path,
                    shape: shape.to_vec(),
                    data: data.to_vec(),
                    positions: positions(),
                });
            }
        }
    });
    if !ACTIVE.load(Ordering::Relaxed) {
        return;
    }
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(st) = g.as_mut() else { return };
    if st.trace.iter().any(|p| glob_match(p, &name)) {
        let hits = st.hits.entry((rank, name.clone())).or_insert(0);
        if *hits < st.trace_limit {
            *hits += 1;
            let s = Stats::of(data);
            let line = format!(
                "[trace] rank={rank} step={step} probe={name} path={} shape={shape:?} l2={:.6e} mean={:.6e} absmax={:.6e} nan={} inf={}\n",
                path.as_str(),
                s.l2,
                s.mean,
                s.absmax,
                s.nan,
                s.inf
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
    if st.capture.iter().any(|p| glob_match(p, &name)) {
        st.records.push(Record {
            name,
            step,
            rank,
            path,
            shape: shape.to_vec(),
            data: data.to_vec(),
            positions: positions(),
        });
    }
}

/// At the end of a step: write this thread's rank's captured records to the dump dir (one
/// safetensors file per step and rank), if dumping is configured.
pub fn end_step() -> std::io::Result<()> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(st) = g.as_mut() else { return Ok(()) };
    let Some(dir) = st.dump_dir.clone() else {
        return Ok(());
    };
    if st.records.is_empty() {
        return Ok(());
    }
    let rank = rank();
    let (records, others): (Vec<Record>, Vec<Record>) = std::mem::take(&mut st.records)
        .into_iter()
        .partition(|r| r.rank == rank);
    st.records = others;
    drop(g);
    if records.is_empty() {
        return Ok(());
    }
    crate::dump::write_step(&dir, &records)
}
