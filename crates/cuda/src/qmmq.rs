//! Dense products of 2 ..= [`QMMQ_MAX_M`] rows of x with Q4_K / Q8_0 weights on int8 tensor
//! cores (`kernels/qmmq.cu`, llama.cpp's MMQ scheme): x is quantized into chunk order by one
//! launch — for Q8_0 per 32 values by the GEMV's rule (`q8_block`, so the CPU executor's
//! activations), for Q4_K with a scale a 256-value chunk and an integer factor 1 ..= 8 a
//! 32-value sub-block ([`x_q8u`]: the super-block's sum stays in integers, x's error near the
//! per-32 rule's) — then
//! each 32-value sub-block of W against it is one `mma.sync m16n8k32` s8. The result is the
//! exact product of the stored weights and the quantized x up to f32 summation order — the
//! GEMV's contract (its x per 32 values), not the bf16 tensor-core path's.
//!
//! Invariants: k % 256 == 0 (whole Q4_K super-blocks; Q8_0's scale rows 16-byte aligned);
//! sm_80+; the grid's splits along K never exceed the chunks (each split has >= 1), and their
//! partial sums are added in split order (`qgemm_reduce`), so results never depend on
//! scheduling.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use crate::moe_grouped::{moe_max_tiles, moe_tile_rows, SortedPairs};
use crate::qgemv::{QMat, QType};
use cudarc::driver::LaunchConfig;

/// Most rows of x a launch takes (8 tiles of 8).
pub const QMMQ_MAX_M: usize = 64;

/// Threads a block (qmmq.cu's MMQ_THREADS: its x staging is unrolled for this count).
const MMQ_THREADS: u32 = 128;

/// Rows of x a kernel takes: 8 * its tiles.
fn tiles(m: usize) -> usize {
    match m {
        0..=8 => 1,
        9..=16 => 2,
        17..=32 => 4,
        _ => 8,
    }
}

fn kernel(ty: QType, nt: usize) -> &'static str {
    match (ty, nt) {
        (QType::Q4K, 1) => "qmmq_q4_k_n1",
        (QType::Q4K, 2) => "qmmq_q4_k_n2",
        (QType::Q4K, 4) => "qmmq_q4_k_n4",
        (QType::Q4K, _) => "qmmq_q4_k_n8",
        (QType::Q8_0, 1) => "qmmq_q8_0_n1",
        (QType::Q8_0, 2) => "qmmq_q8_0_n2",
        (QType::Q8_0, 4) => "qmmq_q8_0_n4",
        (QType::Q8_0, _) => "qmmq_q8_0_n8",
    }
}

/// The grouped kernel for tiles of 8 `nt` rows ([`moe_tile_rows`]: 16 or 64).
fn grouped_kernel(ty: QType, nt: usize) -> &'static str {
    match (ty, nt) {
        (QType::Q4K, 2) => "qmmq_grouped_q4_k_n2",
        (QType::Q4K, _) => "qmmq_grouped_q4_k_n8",
        (QType::Q8_0, 2) => "qmmq_grouped_q8_0_n2",
        (QType::Q8_0, _) => "qmmq_grouped_q8_0_n8",
    }
}

/// Shared memory of a launch with `nt` tiles: 3 stages of x (quants at a 288-byte row
/// stride, then the xds slots of 8 sub-blocks) — qmmq.cu's MMQ_STAGES * mmq_stage_bytes.
fn smem(nt: usize) -> usize {
    3 * (8 * nt * 288 + 8 * 8 * nt * 8)
}

impl Gpu {
    /// Whether [`Gpu::qgemm_mmq`] takes `m` rows against `w`.
    pub fn mmq_fits(&self, w: &QMat, m: usize) -> bool {
        self.has_flash_attn()
            && (1..=QMMQ_MAX_M).contains(&m)
            && w.rows > 0
            && w.cols > 0
            && w.cols.is_multiple_of(256)
    }

    /// out[M, rows] (+)= x[M, cols] . W^T, x bf16 [M, cols], out f32 [M, rows]: x quantized
    /// (per [`x_q8u`]) by `q8_quantize_mmq` into the step's arena, then the
    /// int8 tensor-core kernel, split along K by `qmmq::mmq_splits`.
    pub fn qgemm_mmq(&self, w: &QMat, m: usize, x: u64, out: u64, accumulate: bool) -> Result<()> {
        if !self.mmq_fits(w, m) {
            return Err(CudaError::Invalid(format!(
                "qgemm_mmq: {m} rows of {:?} [{} x {}] on {} (1-{QMMQ_MAX_M} rows, \
                 cols % 256 == 0, sm_80+)",
                w.ty, w.rows, w.cols, self.arch
            )));
        }
        let nt = tiles(m);
        let (xq, xds) = self.quantize_mmq_x(x, m, w.cols, w.ty)?;
        let (m32, k32, n32) = (m as i32, w.cols as i32, w.rows as i32);
        let (xqp, xdp) = (xq.ptr(), xds.ptr());
        let name = kernel(w.ty, nt);
        let bytes = smem(nt);
        self.raise_smem(name, bytes)?;
        let nblk = w.rows.div_ceil(64);
        let splits = self.qgemm_mmq_splits(w, m)?;
        let cfg = LaunchConfig {
            grid_dim: (nblk as u32, splits as u32, 1),
            block_dim: (MMQ_THREADS, 1, 1),
            shared_mem_bytes: bytes as u32,
        };
        let wp = w.w.ptr();
        if splits == 1 {
            let acc = accumulate as i32;
            return self.launch(name, cfg, &args![wp, n32, k32, xqp, xdp, m32, out, acc]);
        }
        let mn = m * w.rows;
        let part = self.alloc::<f32>(splits * mn)?;
        let (pp, zero) = (part.ptr(), 0i32);
        self.launch(name, cfg, &args![wp, n32, k32, xqp, xdp, m32, pp, zero])?;
        let (sp, mn64, acc) = (splits as i32, mn as i64, accumulate as i32);
        self.launch(
            "qgemm_reduce",
            Gpu::cfg((mn.div_ceil(256).min(4096) as u32, 1, 1), 256),
            &args![pp, sp, mn64, acc, out],
        )
    }
}

impl Gpu {
    /// The splits along K [`Gpu::qgemm_mmq`] takes for `m` rows of x against `w`
    /// (`qmmq::mmq_splits`, or `MLASERVE_QMMQ_SPLITS`).
    pub fn qgemm_mmq_splits(&self, w: &QMat, m: usize) -> Result<usize> {
        let (nt, chunks) = (tiles(m), w.cols / 256);
        if let Some(n) = forced_splits() {
            return Ok(n.min(chunks).clamp(1, 16));
        }
        let per_sm = self.mmq_per_sm(kernel(w.ty, nt), smem(nt))?;
        let nblk = w.rows.div_ceil(64);
        Ok(mmq_splits(w.ty, nt, nblk, chunks, self.sm_count, per_sm))
    }

    /// Blocks of kernel `name` resident an SM (the occupancy API through `resident_ctas`, which
    /// raises past-48-KB kernels itself; cached here by a `&'static str` key, as this runs on
    /// every launch's host path and `resident_ctas`' key allocates a String).
    fn mmq_per_sm(&self, name: &'static str, bytes: usize) -> Result<usize> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static CACHE: OnceLock<Mutex<HashMap<(usize, &'static str), usize>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        let key = (self.ordinal, name);
        if let Some(&n) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(n);
        }
        let n = self.resident_ctas(name, MMQ_THREADS as usize, bytes)? / self.sm_count.max(1);
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        Ok(n)
    }

    /// x bf16 [m, k] (m 1 ..= [`QMMQ_MAX_M`], k % 256 == 0) quantized as [`Gpu::qgemm_mmq`]
    /// takes it against `ty` ([`x_q8u`]), in its chunk order: xq [k / 256][mp][256] int8 and
    /// xds [k / 256][8][mp] float pairs, mp = 8 * tiles(m), rows m .. mp zero.
    pub fn quantize_mmq_x(
        &self,
        x: u64,
        m: usize,
        k: usize,
        ty: QType,
    ) -> Result<(DBuf<i8>, DBuf<f32>)> {
        if !(1..=QMMQ_MAX_M).contains(&m) || k == 0 || !k.is_multiple_of(256) {
            return Err(CudaError::Invalid(format!(
                "quantize_mmq_x: {m} rows of {k} values (1-{QMMQ_MAX_M} rows, k % 256 == 0)"
            )));
        }
        let mp = 8 * tiles(m);
        let chunks = k / 256;
        let xq = self.alloc::<i8>(chunks * mp * 256)?;
        let xds = self.alloc::<f32>(2 * chunks * 8 * mp)?;
        let (m32, mp32, k32, q8u) = (m as i32, mp as i32, k as i32, x_q8u(ty));
        let (xqp, xdp) = (xq.ptr(), xds.ptr());
        let blocks = mp * k / 32;
        self.launch(
            "q8_quantize_mmq",
            Gpu::cfg((blocks.div_ceil(256).min(4096) as u32, 1, 1), 256),
            &args![x, m32, mp32, k32, xqp, xdp, q8u],
        )?;
        Ok((xq, xds))
    }

    /// Whether [`Gpu::moe_gemm`] takes quantized experts of `k` columns to [`Gpu::moe_mmq`].
    pub fn moe_mmq_fits(&self, k: usize) -> bool {
        self.has_flash_attn() && k.is_multiple_of(256) && mmq_env() != Some(None)
    }

    /// [`Gpu::moe_gemm`] over quantized experts on the int8 tensor-core kernel: the sorted rows
    /// quantized (per [`x_q8u`]) tile by tile (`q8_quantize_mmq_grouped`, the tiles of
    /// [`moe_tile_rows`]), then one launch over (64 output features, m-tile).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_mmq(
        &self,
        s: &SortedPairs,
        ty: QType,
        w_ptrs: u64,
        x: u64,
        x_div: usize,
        gather: bool,
        n: usize,
        k: usize,
        out: u64,
    ) -> Result<()> {
        if !self.has_flash_attn() || !k.is_multiple_of(256) {
            return Err(CudaError::Invalid(format!(
                "moe_mmq over {ty:?} needs k % 256 == 0 and sm_80+, got k={k} on {}",
                self.arch
            )));
        }
        let bm = moe_tile_rows(s.pairs, s.held);
        let nt = bm / 8;
        let tiles = moe_max_tiles(s.pairs, s.held, bm);
        let xq = self.alloc::<i8>(tiles * k * bm)?;
        let xds = self.alloc::<f32>(2 * tiles * (k / 32) * bm)?;
        let (o, off, to) = (s.order.ptr(), s.offsets.ptr(), s.tile_off.ptr());
        let (xd, ga, h) = (x_div as i32, gather as i32, s.held as i32);
        let (bm32, t32, n32, k32) = (bm as i32, tiles as i32, n as i32, k as i32);
        let (xqp, xdp) = (xq.ptr(), xds.ptr());
        let blocks = tiles * bm * (k / 32);
        let q8u = x_q8u(ty);
        self.launch(
            "q8_quantize_mmq_grouped",
            Gpu::cfg((blocks.div_ceil(256).min(4096) as u32, 1, 1), 256),
            &args![x, o, xd, ga, off, to, h, bm32, t32, k32, xqp, xdp, q8u],
        )?;
        let name = grouped_kernel(ty, nt);
        let bytes = smem(nt);
        self.raise_smem(name, bytes)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(64) as u32, tiles as u32, 1),
            block_dim: (MMQ_THREADS, 1, 1),
            shared_mem_bytes: bytes as u32,
        };
        self.launch(
            name,
            cfg,
            &args![w_ptrs, off, to, h, n32, k32, xqp, xdp, out],
        )
    }
}

/// How the kernels for `ty` take x (the `q8u` argument of the quantize kernels): 1 for Q4_K,
/// x = D * u * q with D a 256-value chunk's amax / 1016 and u = min(8, ceil(amax of the 32-value
/// sub-block / (127 D))) (`q8u_sub`: a super-block's sums stay in integers); 0 for Q8_0, per 32
/// values by `q8_block`'s rule.
pub fn x_q8u(ty: QType) -> i32 {
    (ty == QType::Q4K) as i32
}

/// Blocks of saturating work an SM (the split model's concurrency; session 26, run 2).
const SPLIT_SAT_BLOCKS: usize = 4;
/// A block's fixed cost (its ring's fill, its partial sums), in chunks of K.
const SPLIT_BLOCK_CHUNKS: usize = 3;
/// Fewest chunks a split under the model.
const SPLIT_MIN_CHUNKS: usize = 6;
/// Fewest chunks of K the model is used for (shorter K keeps the older rule).
const SPLIT_MODEL_CHUNKS: usize = 16;

/// The splits along K of a dense launch of `nblk` row blocks (64 rows) over `chunks` chunks of
/// 256 values, `per_sm` of its blocks resident an SM (the occupancy API), `sms` SMs.
///
/// Long K (16+ chunks) over half a block an SM or more, but Q8_0 up to 16 rows: the split, of
/// 6+ chunks each, whose busiest SM finishes first. That SM holds b = ceil(nblk * s / sms)
/// blocks of chunks / s + 3 chunks each (a block's ring fill and partial sums), run `per_sm` at
/// a time, a round of c blocks taking c / min(c, 4) block times (4 blocks of 128 threads
/// saturate an SM; fewer leave latency exposed), each split beyond the first 1% more. Fitted
/// to the lab's sweep of 1-6 splits (`bench/cuda/qgemv.md`, session 26: run 2, 64 rows in run
/// 3), it picks the fastest measured split or one within 5% of it; against the older rule in
/// the same run (run 5, µs): V3 gate/up [18432 x 7168] Q4_K 2 splits at 2-8 rows (33.4 -> 31.4
/// at 8), 3 at 16 (42.4 -> 37.8), 4 at 32 (65.8 -> 55.1), Q8_0 4 at 32-64 (78.9 -> 67.9 at
/// 32); V3 down [7168 x 18432] Q4_K 4 at 2-16 rows (32.9 -> 30.9 at 8).
///
/// Everything else (short K, where a split's ring fill and partials weigh: V2-Lite gate_up's 8
/// chunks in 2 splits 13.5 -> 16.7 µs at 8 rows; small grids, whose time is the launch's
/// latency; Q8_0 up to 16 rows, at 0.85-0.92 of bf16's bytes a second unsplit and slower with
/// each split beyond this rule's): two blocks an SM where the row blocks are fewer, but no more
/// than fit at once (V2-Lite q_proj at 64 rows: 5 splits of its 48 row blocks, one wave at 2
/// blocks an SM, 12.7 µs against 14.3 at 6, runs 3 and 5).
pub(crate) fn mmq_splits(
    ty: QType,
    nt: usize,
    nblk: usize,
    chunks: usize,
    sms: usize,
    per_sm: usize,
) -> usize {
    let (sms, per_sm, nblk) = (sms.max(1), per_sm.max(1), nblk.max(1));
    let model = chunks >= SPLIT_MODEL_CHUNKS && 2 * nblk >= sms && !(ty == QType::Q8_0 && nt <= 2);
    if !model {
        let fill = (2 * sms).div_ceil(nblk).min((per_sm * sms / nblk).max(1));
        return fill.min(chunks).clamp(1, 16);
    }
    // the busiest SM's time, in hundredths of a chunk
    let cost = |s: usize| {
        let mut b = (nblk * s).div_ceil(sms);
        let w = 100 * chunks / s + 100 * SPLIT_BLOCK_CHUNKS;
        let mut t = 0;
        while b > 0 {
            let c = b.min(per_sm);
            t += w * c / c.min(SPLIT_SAT_BLOCKS);
            b -= c;
        }
        t * (100 + s - 1) / 100
    };
    (1..=(chunks / SPLIT_MIN_CHUNKS).clamp(1, 16))
        .min_by_key(|&s| (cost(s), s))
        .unwrap_or(1)
}

/// `MLASERVE_QMMQ_SPLITS=n` (lab, read once): dense launches split along K n ways (at most
/// the chunks, 16), not by the rule.
fn forced_splits() -> Option<usize> {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("MLASERVE_QMMQ_SPLITS").ok()?.parse().ok())
}

/// x (length % 256 == 0) quantized on the host by the q8u rule of [`x_q8u`] (`q8u_sub`), in the
/// same f32 operations (the op table checks the kernel bit for bit against it): per 256-value
/// chunk D = amax / 1016, per 32-value sub-block u = min(8, ceil(amax / (127 D))) (1 where
/// D == 0), q = round(x / (D u)) within ±127. Returns (q, u a sub-block, D a chunk).
pub fn q8u_host(x: &[f32]) -> (Vec<i8>, Vec<i32>, Vec<f32>) {
    let amax = |b: &[f32]| b.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let (mut q, mut u, mut dd) = (vec![0i8; x.len()], Vec::new(), Vec::new());
    for (c, chunk) in x.chunks(256).enumerate() {
        let d = amax(chunk) / 1016.0;
        dd.push(d);
        for (s, blk) in chunk.chunks(32).enumerate() {
            let us = if d > 0.0 {
                ((amax(blk) / (127.0 * d)).ceil() as i32).clamp(1, 8)
            } else {
                1
            };
            u.push(us);
            let step = d * us as f32;
            let id = if step > 0.0 { 1.0 / step } else { 0.0 };
            for (j, &v) in blk.iter().enumerate() {
                q[c * 256 + s * 32 + j] = ((v * id).round() as i32).clamp(-127, 127) as i8;
            }
        }
    }
    (q, u, dd)
}

/// `MLASERVE_QMMQ` (comparisons, read once), for every type and size: exactly `0`: never
/// (dense or grouped); `all`: from 2 rows; a number n in 2 ..= 9: from n rows (the GEMV takes
/// at most 8, so from 9 on the kernel has everything past the GEMV anyway). Anything else
/// (unset, `1`, other values): the rule of [`mmq_from`].
fn mmq_env() -> Option<Option<usize>> {
    static R: std::sync::OnceLock<Option<Option<usize>>> = std::sync::OnceLock::new();
    *R.get_or_init(|| parse_mmq_env(std::env::var("MLASERVE_QMMQ").ok().as_deref()))
}

fn parse_mmq_env(v: Option<&str>) -> Option<Option<usize>> {
    match v? {
        "0" => Some(None),
        "all" => Some(Some(2)),
        n => n
            .parse::<usize>()
            .ok()
            .filter(|n| (2..=crate::qgemv::QMV_GEMV_MAX_M + 1).contains(n))
            .map(Some),
    }
}

/// The fewest rows of x `QPath::choose` gives the int8 tensor-core kernel against a `ty`
/// matrix [rows, cols] where cols % 256 == 0 (below it the GEMV where x fits it, else this
/// kernel); None: never ([`mmq_env`]). By default [`crate::qgemv::QMMQ_FROM_M`], and for Q4_K
/// matrices of at least [`QMMQ_Q4K_EARLY_BYTES`] [`QMMQ_Q4K_EARLY_M`].
pub(crate) fn mmq_from(ty: QType, rows: usize, cols: usize) -> Option<usize> {
    match mmq_env() {
        Some(forced) => forced,
        None if ty == QType::Q4K && rows * ty.row_bytes(cols) >= QMMQ_Q4K_EARLY_BYTES => {
            Some(QMMQ_Q4K_EARLY_M)
        }
        None => Some(crate::qgemv::QMMQ_FROM_M),
    }
}

/// Q4_K matrices of at least this many bytes take the int8 tensor-core kernel from
/// [`QMMQ_Q4K_EARLY_M`] rows (bench/cuda/qgemv.md, session 25, run 5): at 3 / 4 rows it took
/// 14.0 / 13.9 µs against the GEMV's 16.7 / 19.2 on V2-Lite's gate_up (25 MB), 35.4 / 35.3
/// against 37.6 / 43.5 on V3's gate/up and 34.1 / 34.2 against 45.7 / 54.2 on its down (74 MB),
/// and lost on the 3.5 MB q_proj (10.2 / 10.7 against 5.9 / 6.9) and the 2.4 MB o_proj (9.2 /
/// 11.7 against 5.2 / 6.0). Between 3.5 and 25 MB nothing was measured: the bound sits there.
pub const QMMQ_Q4K_EARLY_BYTES: usize = 8 << 20;

/// See [`QMMQ_Q4K_EARLY_BYTES`].
pub const QMMQ_Q4K_EARLY_M: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_the_sweeps_fastest() {
        // run 2 of session 26 (132 SMs; blocks an SM as ptxas' registers give them: Q4_K n1 5,
        // n2 4, n4 3, n8 2; Q8_0 n1 4, n2 4, n4 3, n8 3): the fastest measured split of 1, 2, 3,
        // 4, 6 (µs, qgemv.md's session 26 tables)
        let s = |ty, nt, rows: usize, k: usize, per_sm| {
            mmq_splits(ty, nt, rows.div_ceil(64), k / 256, 132, per_sm)
        };
        let (q4, q8) = (QType::Q4K, QType::Q8_0);
        // V3 gate/up: Q4_K 2 (31.0 against 33.2 unsplit), 3 (37.5 / 42.1), 4 (54.9 / 65.4)
        assert_eq!(s(q4, 1, 18432, 7168, 5), 2);
        assert_eq!(s(q4, 2, 18432, 7168, 4), 3);
        assert_eq!(s(q4, 4, 18432, 7168, 3), 4);
        // Q8_0 unsplit up to 16 rows (45.0 at 8 rows; 2 splits 54.4), 4 at 32 (67.8 / 78.4)
        assert_eq!(s(q8, 1, 18432, 7168, 4), 1);
        assert_eq!(s(q8, 2, 18432, 7168, 4), 1);
        assert_eq!(s(q8, 4, 18432, 7168, 3), 4);
        // V3 down: Q4_K 4 at 8 and 16 rows (30.6 against 32.9 at 3, 8 rows), Q8_0 3 (42.9
        // against 45.2 at 4)
        assert_eq!(s(q4, 1, 7168, 18432, 5), 4);
        assert_eq!(s(q4, 2, 7168, 18432, 4), 4);
        assert_eq!(s(q8, 1, 7168, 18432, 4), 3);
        // V2-Lite gate_up (8 chunks): unsplit at every size (2 splits 16.7 against 13.5)
        for nt in [1, 2, 4] {
            assert_eq!(s(q4, nt, 21888, 2048, if nt == 1 { 5 } else { 4 }), 1);
        }
        // (run 3) at 64 rows too: V2-Lite gate_up unsplit (2 splits 45.6 against 39.4), V3 gate/up
        // Q4_K 3 (103.6 against 122.0 unsplit; 4: 99.0), Q8_0 4 (111.9 against 131.1)
        assert_eq!(s(q4, 8, 21888, 2048, 2), 1);
        assert_eq!(s(q4, 8, 18432, 7168, 2), 3);
        assert_eq!(s(q8, 8, 18432, 7168, 3), 4);
        // small grids: two blocks an SM, no more than fit at once — V3 shared gate|up 5 (8
        // splits 12.8 against 12.1 at 8 rows), 4 at 64 rows (2 blocks an SM: 26.9 against
        // 33.0 at 5); V2-Lite o_proj 8 (its chunks); V2-Lite q_proj 6, 5 at 64 rows
        assert_eq!(s(q4, 1, 4096, 7168, 5), 5);
        assert_eq!(s(q4, 8, 4096, 7168, 2), 4);
        assert_eq!(s(q4, 1, 2048, 2048, 5), 8);
        assert_eq!(s(q4, 1, 3072, 2048, 5), 6);
        assert_eq!(s(q4, 8, 3072, 2048, 2), 5);
        // V2-Lite's shared experts' gate|up (88 row blocks, 8 chunks): 3, as before
        assert_eq!(s(q4, 1, 5632, 2048, 5), 3);
        // never more splits than chunks or 16, at least 1
        assert_eq!(s(q4, 1, 64, 512, 5), 2);
        assert_eq!(s(q4, 1, 64, 256 * 40, 5), 16);
        for (rows, chunks) in [(9000, 200), (64, 1), (130_000, 28), (576, 7), (18432, 12)] {
            for (ty, nt) in [(q4, 1), (q4, 8), (q8, 2), (q8, 4)] {
                let n = s(ty, nt, rows, 256 * chunks, 3);
                assert!((1..=chunks.min(16)).contains(&n), "{rows} x {chunks}: {n}");
            }
        }
        assert_eq!(mmq_splits(q8, 8, 0, 0, 0, 0), 1);
    }

    #[test]
    fn every_kernel_is_loaded_and_tiles_cover_m() {
        for ty in [QType::Q4K, QType::Q8_0] {
            for m in 1..=QMMQ_MAX_M {
                let nt = tiles(m);
                // enough rows, and never more tiles than twice the rows need
                assert!(8 * nt >= m && 8 * nt < 2 * m + 8, "m {m} nt {nt}");
                assert!(crate::kernels::NAMES.contains(&kernel(ty, nt)));
            }
            // the grouped kernels instantiated for every tile size the sort can choose
            for (pairs, held) in [(6, 64), (384, 64), (4096, 64), (1, 1)] {
                let bm = moe_tile_rows(pairs, held);
                let name = grouped_kernel(ty, bm / 8);
                assert!(crate::kernels::NAMES.contains(&name), "{name}");
                let nt = if name.ends_with("_n2") { 2 } else { 8 };
                assert_eq!(nt, bm / 8, "{name} for {bm}-row tiles");
            }
        }
        // MLASERVE_QMMQ: only exactly "0" turns the kernel off; "1" is not "from 1 row"
        assert_eq!(parse_mmq_env(None), None);
        assert_eq!(parse_mmq_env(Some("0")), Some(None));
        assert_eq!(parse_mmq_env(Some("all")), Some(Some(2)));
        assert_eq!(parse_mmq_env(Some("3")), Some(Some(3)));
        assert_eq!(parse_mmq_env(Some("9")), Some(Some(9)));
        for other in ["1", "00", "10", "64", "on", ""] {
            assert_eq!(parse_mmq_env(Some(other)), None, "{other}");
        }
        // the source's stage size, for the largest tile count
        assert!(crate::kernels::SOURCE.contains("#define MMQ_XS 288"));
        assert!(crate::kernels::SOURCE.contains("#define MMQ_STAGES 3"));
        assert!(crate::kernels::SOURCE.contains(&format!("#define MMQ_THREADS {MMQ_THREADS}")));
        assert_eq!(smem(8), 3 * (64 * 288 + 64 * 64));
    }

    #[test]
    fn q8u_host_keeps_each_sub_block_step_small() {
        // every value within half a step of x (the step its sub-block's D u), u the
        // smallest factor that keeps |q| <= 127, the chunk's largest sub-block at u = 8;
        // a zero chunk all zeros at u = 1
        let mut x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        x[300] = 9.0; // an outlier: the other sub-blocks of chunk 1 keep small steps
        x[..256]
            .iter_mut()
            .skip(64)
            .take(32)
            .for_each(|v| *v *= 1e-3);
        let (q, u, d) = q8u_host(&x);
        for (i, &v) in x.iter().enumerate() {
            let step = d[i / 256] * u[i / 32] as f32;
            let back = q[i] as f32 * step;
            assert!(
                (back - v).abs() <= 0.5 * step * (1.0 + 1e-5),
                "{i}: {v} vs {back}"
            );
        }
        for (b, blk) in x.chunks(32).enumerate() {
            let amax = blk.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let smaller = 127.0 * d[b / 8] * (u[b] - 1) as f32;
            assert!(
                u[b] == 1 || amax > smaller,
                "sub-block {b}: u {} not the smallest",
                u[b]
            );
        }
        assert_eq!(u[300 / 32], 8);
        assert!(u.iter().all(|&u| (1..=8).contains(&u)));
        assert!(u[8..].contains(&1), "{u:?}");
        assert_eq!(
            u[2], 1,
            "a sub-block 1000x smaller than its chunk: the smallest step"
        );
        let (q0, u0, d0) = q8u_host(&[0.0; 256]);
        assert!(q0.iter().all(|&q| q == 0) && u0.iter().all(|&u| u == 1) && d0 == [0.0]);
    }
}
