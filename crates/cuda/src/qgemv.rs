//! GGUF weights kept compressed on the GPU: Q8_0 and Q4_K matrices ([`QMat`]) and the
//! products over them ([`Gpu::qgemm`] picks by M, [`QPath::choose`]):
//! - M = 1 .. [`QMV_GEMV_MAX_M`]: x quantized to int8 per 32 values in the kernel's shared
//!   memory (ggml's Q8_0 rule, as the CPU executor does for quantized weights;
//!   [`Gpu::quantize_x`] is the same rule on its own), then int8 dot products (dp4a) against
//!   the stored quants on a persistent grid, each weight read once for all the rows
//!   ([`Gpu::qmv`], `kernels/qgemv.cu`); the MoE expert GEMV runs the same kernel over
//!   (token, expert) pairs ([`Gpu::qmv_pairs`]).
//! - up to [`crate::qmmq::QMMQ_MAX_M`] where K % 256 == 0: x quantized to int8 (Q8_0 per 32
//!   values as for the GEMV; Q4_K with a scale a 256-value chunk and an integer factor a
//!   sub-block, [`crate::qmmq::x_q8u`]), int8 tensor cores (mma.sync m16n8k32) over the
//!   stored quants ([`Gpu::qgemm_mmq`], qmmq.rs).
//! - up to [`QGEMM_TC_MAX_M`] otherwise: the grouped GEMM's tensor-core kernel in dense mode
//!   ([`Gpu::qgemm_tc`], moe_grouped.rs): weight tiles dequantized to bf16 in shared memory,
//!   x bf16, every weight read once. The grouped expert GEMM does the same per expert.
//! - larger M: the weights dequantized in row chunks to a bf16 scratch and cuBLAS.
//!
//! The tensor-core and cuBLAS paths compute exactly what a bf16 upload of the dequantized
//! weights would; the GEMV differs from that by quantizing x.
//!
//! Invariants: a `QMat` holds `rows * row_bytes(cols)` bytes followed by at least 16 zero
//! bytes: Q4_K as ggml's super-blocks, rows back to back; Q8_0 repacked so every load is
//! aligned: the int8 quants as a [rows, cols] matrix, then the f16 scales as a
//! [rows, cols / 32] matrix. `cols` is a multiple of the type's block size. The dequantized
//! values equal the CPU dequantizer's (`QMatrix::to_f32`) exactly; the dequantize kernels
//! round them to bf16 (nearest even).

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::{DBuf, Gpu};
use crate::ops::{Gemm, GemmType, SliceViews};
use cudarc::driver::LaunchConfig;
use mlaserve_gguf::GgmlType;

/// A GGUF block type the GPU keeps compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    /// 32 values: f16 scale + 32 int8 (34 bytes).
    Q8_0,
    /// 256 values: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
    Q4K,
}

impl QType {
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        match t {
            GgmlType::Q8_0 => Some(QType::Q8_0),
            GgmlType::Q4_K => Some(QType::Q4K),
            _ => None,
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            QType::Q8_0 => GgmlType::Q8_0,
            QType::Q4K => GgmlType::Q4_K,
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            QType::Q8_0 => 32,
            QType::Q4K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QType::Q8_0 => 34,
            QType::Q4K => 144,
        }
    }

    /// Bytes of one row of `k` values.
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_values() * self.block_bytes()
    }

    pub(crate) fn tag(self) -> &'static str {
        match self {
            QType::Q8_0 => "q8_0",
            QType::Q4K => "q4_k",
        }
    }
}

/// A quantized matrix [rows, cols] on the device (see the module invariants).
pub struct QMat {
    pub ty: QType,
    pub rows: usize,
    pub cols: usize,
    pub w: DBuf<u8>,
    /// [1]: the device pointer of `w` (the tensor-core kernel takes a pointer table).
    pub ptr: DBuf<u64>,
}

impl QMat {
    /// Bytes of quants and scales (without the padding).
    pub fn bytes(&self) -> usize {
        self.rows * self.ty.row_bytes(self.cols)
    }

    /// The device address of row `r`'s quants: Q4_K rows are their blocks, one after
    /// another; Q8_0's quants are [rows, cols] int8, their scales after every row. A
    /// shared-expert slice's table entry ([`Gpu::qmv_pairs_glu`]).
    pub fn row_ptr(&self, r: usize) -> u64 {
        match self.ty {
            QType::Q8_0 => self.w.at(r * self.cols),
            QType::Q4K => self.w.at(r * self.ty.row_bytes(self.cols)),
        }
    }

    /// The fewest rows of x [`Gpu::qgemm`] takes to the int8 tensor-core kernel for this
    /// matrix (`qmmq::mmq_from`; None: never).
    pub fn mmq_from(&self) -> Option<usize> {
        crate::qmmq::mmq_from(self.ty, self.rows, self.cols)
    }
}

/// Q8_0 ggml blocks of a [rows, cols] matrix -> the GPU layout: int8 quants [rows, cols], then
/// f16 scales [rows, cols / 32].
pub fn repack_q8_0(rows: usize, cols: usize, blocks: &[u8]) -> Vec<u8> {
    let nb = cols / 32;
    let mut out = vec![0u8; rows * cols + rows * nb * 2];
    let (qs, ds) = out.split_at_mut(rows * cols);
    for (i, b) in blocks.chunks_exact(34).take(rows * nb).enumerate() {
        ds[2 * i..2 * i + 2].copy_from_slice(&b[..2]);
        qs[32 * i..32 * i + 32].copy_from_slice(&b[2..]);
    }
    out
}

/// x quantized per 32 values by [`Gpu::quantize_x`]: int8 [m, k], and per 32 values the scale
/// d and d * sum(q) — the rule the GEMV applies to x in shared memory (the op table checks
/// it against the host through this kernel).
pub struct QuantX {
    pub m: usize,
    pub k: usize,
    pub q: DBuf<i8>,
    pub d: DBuf<f32>,
    pub s: DBuf<f32>,
}

/// Elements of the bf16 scratch [`Gpu::qgemm`] dequantizes into (32 MiB); larger matrices
/// go through it in row chunks, each its own GEMM into a column range of the output.
pub const DEQUANT_CHUNK: usize = 16 << 20;

/// Largest K of the GEMV (it quantizes x into shared memory: K + K / 4 bytes).
pub const QMV_MAX_K: usize = 32768;

/// Largest M [`Gpu::qgemm`] runs as one GEMV launch (each weight read once for every row of
/// x), where x fits in half an SM's shared memory (two blocks per SM); past that the
/// tensor-core kernel is faster (bench/cuda/qgemv.md: two 8-row launches at M = 16 took
/// 1.2-2x its time).
pub const QMV_GEMV_MAX_M: usize = 8;

/// Largest M [`Gpu::qgemm`] runs on the tensor-core kernel that dequantizes weight tiles in
/// shared memory (moe_grouped.rs, one 16- or 64-row tile: the weights are read once); larger
/// M dequantizes the whole matrix for cuBLAS.
pub const QGEMM_TC_MAX_M: usize = 64;

/// How [`Gpu::qgemm`] computes a product with `m` rows of x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QPath {
    /// [`Gpu::qmv`], [`QmvVariant::MAX_M`] rows of x a launch.
    Gemv,
    /// [`Gpu::qgemm_mmq`] (qmmq.rs): x quantized to int8, int8 tensor cores.
    Mmq,
    /// [`Gpu::qgemm_tc`].
    TensorCore,
    /// Row chunks dequantized to bf16, cuBLAS.
    Dequantize,
}

impl QPath {
    /// The path for `m` rows of x against a matrix of `k` columns, given the GPU's opt-in shared
    /// memory per block, whether it has the tensor-core kernels (sm_80+) and the fewest rows
    /// the int8 tensor-core kernel takes for this matrix (`from`: `qmmq::mmq_from`; None:
    /// never). That kernel takes from `from` rows where K % 256 == 0; the GEMV up to
    /// [`QMV_GEMV_MAX_M`] rows where x leaves room for two blocks per SM (one block of an
    /// 8-row GEMV over K = 18,432 measured slower than the tensor-core kernel), or one row
    /// wherever it fits; without tensor cores, up to 32 rows wherever they fit.
    pub fn choose(m: usize, k: usize, max_smem: usize, tc: bool, from: Option<usize>) -> Self {
        let fits = |m: usize, share: usize| {
            k <= QMV_MAX_K
                // (the kernels' shared memory depends on the vector count alone)
                && QmvVariant::for_m(QType::Q8_0, m.min(QmvVariant::MAX_M))
                    .is_some_and(|v| v.smem(k) <= max_smem / share)
        };
        let mmq = tc && k.is_multiple_of(256) && m <= crate::qmmq::QMMQ_MAX_M && from.is_some();
        if mmq && from.is_some_and(|lo| m >= lo) {
            QPath::Mmq
        } else if (m <= QMV_GEMV_MAX_M && (fits(m, 2) || (m == 1 && fits(1, 1))))
            || (!tc && m <= 32 && fits(m, 1))
        {
            QPath::Gemv
        } else if mmq {
            QPath::Mmq
        } else if tc && m <= QGEMM_TC_MAX_M {
            QPath::TensorCore
        } else {
            QPath::Dequantize
        }
    }
}

/// One GEMV kernel: `r` rows a warp, up to `mt` vectors, `wide`: a lane loads two 16-byte
/// words of quants a row a step instead of one (Q8_0: 32 quants; Q4_K: a whole sub-block
/// pair, so each header a lane loads serves 64 weights, not 32), and `ctas` resident an SM
/// (2; or 3 for [`QmvVariant::WIDE3`], with one step in flight instead of two)
/// (`qmv_<ty>_r<r>m<mt>[w|w3]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QmvVariant {
    pub r: usize,
    pub mt: usize,
    pub wide: bool,
    pub ctas: usize,
    /// Q4_K, one vector, sm_90+: the steps in flight copied into shared memory by
    /// `cp.async.bulk` (`qmv_q4_k_r2m1b[3]`; [`QmvVariant::BULK`]).
    pub bulk: bool,
}

impl QmvVariant {
    /// Every plain kernel `qgemv.cu` instantiates (per type); [`QmvVariant::ONE_VECTOR`]
    /// lists those with `_glu` and `_comb` twins.
    pub const ALL: [QmvVariant; 12] = [
        QmvVariant::narrow(1, 1),
        QmvVariant::narrow(2, 1),
        QmvVariant::narrow(4, 1),
        QmvVariant::narrow(2, 2),
        QmvVariant::narrow(2, 4),
        QmvVariant::narrow(2, 8),
        QmvVariant::wide(2, 1),
        QmvVariant::wide(4, 1),
        QmvVariant::wide(2, 2),
        QmvVariant::wide(2, 4),
        QmvVariant::wide(2, 8),
        QmvVariant::WIDE3,
    ];

    /// 2 rows a warp, one vector, two words, three CTAs an SM (80 registers, one step in
    /// flight): [`Gpu::qmv`] takes it where its 1.5x as many warps deal the row groups out
    /// more evenly ([`w3_evener`]).
    pub const WIDE3: QmvVariant = QmvVariant {
        r: 2,
        mt: 1,
        wide: true,
        ctas: 3,
        bulk: false,
    };

    /// Q4_K at one vector on sm_90+: the `r2m1w` walk (the same lanes sum the same steps:
    /// the same sums bit for bit) with each warp's four steps in flight copied into its
    /// shared-memory slots by `cp.async.bulk` instead of loaded into registers
    /// (`qmv_q4_k_r2m1b`).
    pub const BULK: QmvVariant = QmvVariant {
        r: 2,
        mt: 1,
        wide: true,
        ctas: 2,
        bulk: true,
    };

    /// The narrowest K [`Gpu::qmv`] takes [`QmvVariant::BULK`] at (`MLASERVE_QMV_BULK=0`:
    /// never, `=all`: always, for comparisons). Session 16 (bench/cuda/
    /// qgemv.md): faster than the register walk at K = 7,168 (V3 gate/up 22.1 -> 20.8 µs) and
    /// 18,432 (V3 down 23.5 -> 22.6), slower at 2,048 (V2-Lite's gate_up 9.2 -> 11.0: a row
    /// group is one step there, and the copies' round trip through shared memory and its
    /// barrier costs more than the registers' deeper pipeline gains); 4,096 lies between,
    /// unmeasured.
    pub const BULK_MIN_K: usize = 4096;

    /// [`QmvVariant::BULK`] at three CTAs an SM, three slots a warp (`qmv_q4_k_r2m1b3`), taken
    /// where it deals the row groups out more evenly ([`w3_evener`]).
    pub const BULK3: QmvVariant = QmvVariant {
        ctas: 3,
        ..QmvVariant::BULK
    };

    /// Steps a warp has in flight in shared memory (bulk kernels; qgemv.cu's QMV_ENTRY_B).
    fn slots(self) -> usize {
        match (self.bulk, self.ctas) {
            (false, _) => 0,
            (true, 3) => 3,
            (true, _) => 4,
        }
    }

    const fn narrow(r: usize, mt: usize) -> Self {
        QmvVariant {
            r,
            mt,
            wide: false,
            ctas: 2,
            bulk: false,
        }
    }

    const fn wide(r: usize, mt: usize) -> Self {
        QmvVariant {
            r,
            mt,
            wide: true,
            ctas: 2,
            bulk: false,
        }
    }

    /// Most vectors one launch takes.
    pub const MAX_M: usize = 8;

    /// The kernel for `m` vectors (1..=8) of a `ty` matrix: 2 rows a warp; two words a lane
    /// for one vector, and for more with Q8_0 (session 9, bench/cuda/qgemv.md: at one vector
    /// within 3% of the lab's fastest variant on the V3 and V2-Lite MLP shapes; at 2 and 4
    /// vectors 10-25% faster than one word for Q8_0, 0-30% slower for Q4_K).
    pub fn for_m(ty: QType, m: usize) -> Option<Self> {
        let wide = m == 1 || ty == QType::Q8_0;
        let mt = match m {
            1 => 1,
            2 => 2,
            3 | 4 => 4,
            5..=8 => 8,
            _ => return None,
        };
        Some(QmvVariant {
            r: 2,
            mt,
            wide,
            ctas: 2,
            bulk: false,
        })
    }

    /// The expert GEMV's kernel (its pairs run side by side, each over few rows).
    pub const PAIRS: QmvVariant = QmvVariant::wide(2, 1);

    /// The two kernels a single vector runs on, each with a SwiGLU twin (`<kernel>_glu`,
    /// [`Gpu::qmv_glu_variant`]) and a combine twin (`<kernel>_comb`, [`Gpu::qmv_combine`]).
    pub const ONE_VECTOR: [QmvVariant; 2] = [QmvVariant::wide(2, 1), QmvVariant::WIDE3];

    /// The one-vector kernels of `ty` with twins: [`QmvVariant::ONE_VECTOR`], and for Q4_K
    /// the bulk kernels (sm_90+ only).
    pub fn one_vector(ty: QType) -> Vec<QmvVariant> {
        let mut v = QmvVariant::ONE_VECTOR.to_vec();
        if ty == QType::Q4K {
            v.extend([QmvVariant::BULK, QmvVariant::BULK3]);
        }
        v
    }

    pub fn kernel(self, ty: QType) -> String {
        if self.bulk {
            let c = if self.ctas == 3 { "3" } else { "" };
            return format!("qmv_{}_r2m1b{c}", ty.tag());
        }
        let w = match (self.wide, self.ctas) {
            (false, _) => "",
            (true, 3) => "w3",
            (true, _) => "w",
        };
        format!("qmv_{}_r{}m{}{w}", ty.tag(), self.r, self.mt)
    }

    /// CTAs of 8 warps covering `rows` rows once.
    pub fn blocks(self, rows: usize) -> usize {
        rows.div_ceil(8 * self.r)
    }

    /// Dynamic shared memory for width `k`: x of `mt` vectors as int8, d and d * sum per 32;
    /// bulk kernels then 8 warps' slots (2 rows of 8 super-blocks, 2,304 bytes) and their
    /// 8-byte barriers.
    pub fn smem(self, k: usize) -> usize {
        self.mt * (k + k / 32 * 8) + 8 * self.slots() * (2 * 8 * 144 + 8)
    }

    /// Dynamic shared memory of the `_norm` twin ([`Gpu::qmv_norm`]): [`QmvVariant::smem`],
    /// then (16-byte aligned) the normalized row as k bf16 and the block sum's 32 floats (the
    /// twins have no static shared memory, so the bulk ones' opt-in maximum stays theirs).
    pub fn smem_norm(self, k: usize) -> usize {
        self.smem(k).next_multiple_of(16) + 2 * k + 32 * 4
    }
}

/// `MLASERVE_QMV_WIDE=0` (comparisons, read once): the one-word kernel where
/// [`QmvVariant::for_m`] or [`QmvVariant::PAIRS`] name a wide one.
fn narrow_only(v: QmvVariant) -> QmvVariant {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let wide = *WIDE.get_or_init(|| std::env::var("MLASERVE_QMV_WIDE").map_or(true, |v| v != "0"));
    if wide {
        v
    } else {
        QmvVariant::narrow(v.r, v.mt)
    }
}

/// How evenly `groups` row groups dealt round robin keep `warps` warps busy: the mean rounds
/// a warp walks over the most any warp walks (1: every warp the same).
fn evenness(groups: usize, warps: usize) -> f64 {
    let r = groups as f64 / warps.max(1) as f64;
    r / r.ceil().max(1.0)
}

/// Whether [`QmvVariant::WIDE3`] (`warps3` resident warps) deals `groups` row groups out
/// more evenly than the two-CTA kernel (`warps2`), by more than 5 points. Session 12 (bench/
/// cuda/qgemv.md, runs 1-3): V3 gate/up, 9,216 groups, 0.87 -> 0.97, Q4_K 23.7 -> 22.5 µs and
/// Q8_0 36.1 -> 35.7; where it would deal them less evenly it lost (V3 down, 3,584 groups,
/// 0.85 -> 0.57: 24.7 -> 29.8 µs), and at equal evenness the two-CTA kernel's two steps in
/// flight were as fast or faster (V2-Lite gate_up). (Stream-K, the same number of K steps
/// for every warp, and grids covering the groups once were slower everywhere.)
pub fn w3_evener(groups: usize, warps2: usize, warps3: usize) -> bool {
    evenness(groups, warps3) > evenness(groups, warps2) + 0.05
}

/// The fewest CTAs of 8 warps (at most `resident`) that walk `groups` row groups in as many
/// rounds as the full persistent grid would, so every warp walks that many groups or one
/// fewer: V3 down's 3,584 groups take 224 CTAs (two groups a warp) instead of 264 (one round
/// full, the second 70% busy). A lab instrument (examples/qgemv.rs); the engine's grids are
/// full (bench/cuda/qgemv.md, session 14: at most 2.7% faster).
pub fn even_grid(groups: usize, resident: usize) -> usize {
    let rounds = groups.div_ceil(8 * resident.max(1)).max(1);
    groups
        .div_ceil(rounds)
        .div_ceil(8)
        .clamp(1, resident.max(1))
}

/// The routed experts' weighted sum [`Gpu::qmv_combine`] adds in its epilogue, as
/// [`Gpu::moe_combine_pairs`] computes it: `y` f32 [m * k, rows] (token v's slot j at row
/// v * k + j), `w` f32 [m, k].
#[derive(Clone, Copy, Debug)]
pub struct PairCombine {
    pub y: u64,
    pub w: u64,
    pub k: usize,
}

/// The RMSNorm [`Gpu::qmv_norm`] computes x by: x = bf16(RMSNorm(`x` f32 [1, k]) * `gamma`),
/// as `rms_norm` computes it (the same bits); `hnb` (0: none) receives that row.
#[derive(Clone, Copy, Debug)]
pub struct QmvNorm {
    pub x: u64,
    pub gamma: u64,
    pub eps: f32,
    pub hnb: u64,
}

/// A second matrix for [`Gpu::qmv_norm`]: `w` of the first's type and width, whose product
/// with the same normed x goes to `out` f32 [w.rows].
#[derive(Clone, Copy)]
pub struct QmvAlso<'a> {
    pub w: &'a QMat,
    pub out: u64,
}

/// What a GEMV launch writes: out (f32, `accumulate` adds), act = SwiGLU of row pairs (i, f + i)
/// (bf16 [*, f]; over pairs, a shared-expert slice's (i, fs + i): `views`), or out += the
/// routed experts' combine, then the product.
#[derive(Clone, Copy, Debug)]
enum Epilogue {
    Plain,
    Glu {
        f: usize,
        act: u64,
        views: SliceViews,
    },
    Combine(PairCombine),
}

impl Epilogue {
    /// The kernels' (glu, act, cy, cw, ck, sl_from, sl_up) arguments.
    fn args(self) -> (i32, u64, u64, u64, i32, i32, i32) {
        let (sl_from, sl_up) = SliceViews::NONE.args();
        match self {
            Epilogue::Plain => (0, 0, 0, 0, 0, sl_from, sl_up),
            Epilogue::Glu { f, act, views } => {
                let (sl_from, sl_up) = views.args();
                (f as i32, act, 0, 0, 0, sl_from, sl_up)
            }
            Epilogue::Combine(c) => (0, 0, c.y, c.w, c.k as i32, sl_from, sl_up),
        }
    }
}

/// `MLASERVE_QMV_COMBINE=0` (comparisons, read once): the routed experts' combine in a launch
/// of its own, never in the shared expert's down projection ([`Gpu::qmv_combine`]).
fn combine_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_COMBINE").map_or(true, |v| v != "0"))
}

/// `MLASERVE_QMV_GLU=0` (comparisons, read once): never the SwiGLU epilogue; nor with
/// `MLASERVE_QMV_WIDE=0`, whose one-word kernels have no `_glu` twin.
fn glu_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_GLU").map_or(true, |v| v != "0"))
        && narrow_only(QmvVariant::PAIRS) == QmvVariant::PAIRS
}

/// The expert GEMV's kernel over pairs (`glu`: the gate|up launch with the SwiGLU epilogue):
/// [`QmvVariant::PAIRS`] (two CTAs an SM, two K steps in flight), or with
/// `MLASERVE_QMV_PAIRS_W3=1` (every pairs launch) or `=glu` (the gate|up ones) — read once; a
/// lab knob, off — [`QmvVariant::WIDE3`] (three CTAs an SM, one step): the same sums bit for
/// bit. On the Q4_K V2-Lite b1 step before shared slices, `=glu` took 10 µs off 1,485 (H100,
/// session 46, bench/cuda/v2lite.md); a launch with slices keeps the two-CTA kernel
/// ([`Gpu::qmv_pairs_glu`]), so one-token steps no longer take it, and 2-4 tokens were not
/// measured.
fn pairs_kernel(glu: bool) -> QmvVariant {
    static W3: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    let (all, gate_up) = *W3.get_or_init(|| {
        let v = std::env::var("MLASERVE_QMV_PAIRS_W3").unwrap_or_default();
        (v == "1", v == "1" || v == "glu")
    });
    let w3 = if glu { gate_up } else { all };
    match narrow_only(QmvVariant::PAIRS) {
        v if v == QmvVariant::PAIRS && w3 => QmvVariant::WIDE3,
        v => v,
    }
}

/// Whether [`Gpu::qmv_pairs_after`] looks its matrices up before the wait where the caller
/// allows it (`MLASERVE_QMV_PAIRS_EARLY=0`: never, for comparisons).
pub(crate) fn pairs_early() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_PAIRS_EARLY").map_or(true, |v| v != "0"))
}

/// The narrowest K the bulk kernels run at: [`QmvVariant::BULK_MIN_K`]; `MLASERVE_QMV_BULK=0`
/// (comparisons, read once): never ([`usize::MAX`]); `=all`: at every K.
fn bulk_min_k() -> usize {
    static K: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *K.get_or_init(|| match std::env::var("MLASERVE_QMV_BULK").as_deref() {
        Ok("0") => usize::MAX,
        Ok("all") => 0,
        _ => QmvVariant::BULK_MIN_K,
    })
}

/// Rows of x from which the int8 tensor-core kernel beats the GEMV (bench/cuda/qgemv.md,
/// session 23: at 8 rows on every shape, at 4 on the large ones only, at 2 on none); large
/// Q4_K matrices from fewer (`qmmq::QMMQ_Q4K_EARLY_M`).
pub const QMMQ_FROM_M: usize = 5;

/// `MLASERVE_QMV_W3=0` (comparisons, read once): never [`QmvVariant::WIDE3`].
fn w3_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_QMV_W3").map_or(true, |v| v != "0"))
}

impl Gpu {
    /// Uploads `bytes` (raw ggml blocks of a [rows, cols] matrix of `ty`) in the GPU layout.
    pub fn upload_qmat(&self, ty: QType, rows: usize, cols: usize, bytes: &[u8]) -> Result<QMat> {
        if !cols.is_multiple_of(ty.block_values()) {
            return Err(CudaError::Invalid(format!(
                "{ty:?} matrix with {cols} columns: not a multiple of the block size {}",
                ty.block_values()
            )));
        }
        let need = rows * ty.row_bytes(cols);
        if bytes.len() != need {
            return Err(CudaError::Invalid(format!(
                "{ty:?} [{rows} x {cols}] needs {need} bytes of blocks, got {}",
                bytes.len()
            )));
        }
        let repacked;
        let bytes = match ty {
            QType::Q8_0 => {
                repacked = repack_q8_0(rows, cols, bytes);
                &repacked[..]
            }
            QType::Q4K => bytes,
        };
        // 16 bytes past the end at least: the grouped GEMM copies scale words in 8-byte pairs.
        let padded = need.div_ceil(16) * 16 + 16;
        let w = self.alloc_filled::<u8>(padded, 0)?;
        if need > 0 {
            // SAFETY: w holds at least `need` bytes.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(w.ptr(), bytes, self.stream.cu_stream())
            }
            .map_err(|e| CudaError::driver("copy of quantized weights to the device", e))?;
        }
        let ptr = self.upload(&[w.ptr()])?;
        Ok(QMat {
            ty,
            rows,
            cols,
            w,
            ptr,
        })
    }

    /// x bf16 [m, k] (k % 32 == 0) quantized to int8 per 32 values.
    pub fn quantize_x(&self, x: u64, m: usize, k: usize) -> Result<QuantX> {
        if !k.is_multiple_of(32) {
            return Err(CudaError::Invalid(format!(
                "quantize_x: k = {k} is not a multiple of 32"
            )));
        }
        let blocks = m * k / 32;
        let qx = QuantX {
            m,
            k,
            q: self.alloc(m * k)?,
            d: self.alloc(blocks)?,
            s: self.alloc(blocks)?,
        };
        if blocks > 0 {
            let grid = blocks.div_ceil(256).min(65_535) as u32;
            let (q, d, s, b) = (qx.q.ptr(), qx.d.ptr(), qx.s.ptr(), blocks as i64);
            self.launch(
                "q8_quantize_x",
                Gpu::cfg((grid, 1, 1), 256),
                &args![x, b, q, d, s],
            )?;
        }
        Ok(qx)
    }

    /// out[v, r] (+)= W[r, :] . x[row0 + v, :] for v < m (1..=8) of x bf16 [*, cols]
    /// (quantized per 32 values inside the kernel); out f32 [m, rows]. `accumulate` adds.
    pub fn qmv(
        &self,
        w: &QMat,
        x: u64,
        row0: usize,
        m: usize,
        out: u64,
        accumulate: bool,
    ) -> Result<()> {
        let v = self.qmv_kernel_for(w, m)?;
        self.qmv_variant(w, x, row0, m, out, accumulate, v, None)
    }

    /// The kernel [`Gpu::qmv`] runs for `m` vectors against `w`.
    fn qmv_kernel_for(&self, w: &QMat, m: usize) -> Result<QmvVariant> {
        let v = QmvVariant::for_m(w.ty, m).ok_or_else(|| {
            CudaError::Invalid(format!(
                "qmv takes 1..={} vectors, got {m}",
                QmvVariant::MAX_M
            ))
        })?;
        if m == 1 {
            self.qmv_one_vector(w)
        } else {
            Ok(narrow_only(v))
        }
    }

    /// out[0, :] = W . x for one token whose x the kernel makes from an f32 row by the RMSNorm
    /// `n` — bit for bit `rms_norm` into hnb, then [`Gpu::qgemm`] of hnb — leaving that row in
    /// `n.hnb`: the attention's norm without a launch of its own; and `also.w` . x into
    /// `also.out` in the same launch (kv_a beside q_a / q_proj: bit for bit [`Gpu::qgemm`] of
    /// hnb). Only where [`Gpu::qmv_norm_fits`] (an error elsewhere).
    pub fn qmv_norm(&self, w: &QMat, n: QmvNorm, out: u64, also: Option<QmvAlso>) -> Result<()> {
        if !self.qmv_norm_fits(w, also.map(|a| a.w))? {
            return Err(CudaError::Invalid(format!(
                "qmv_norm over {:?} [{} x {}]{}: not on the one-vector GEMV with a norm twin",
                w.ty,
                w.rows,
                w.cols,
                also.map_or(String::new(), |a| format!(
                    " and {:?} [{} x {}]",
                    a.w.ty, a.w.rows, a.w.cols
                ))
            )));
        }
        let v = self.one_vector_for(w.ty, w.rows + also.map_or(0, |a| a.w.rows), w.cols)?;
        self.qmv_norm_variant(w, n, out, also, v)
    }

    /// Whether [`Gpu::qmv_norm`] runs for `w` (and `also`, of the same type and width): the
    /// one-vector GEMV ([`Gpu::qgemm`]'s path for each alone) over their rows together, with a
    /// `_norm` twin (two words a lane: not under `MLASERVE_QMV_WIDE=0`) that fits as many CTAs
    /// an SM as the plain kernel.
    pub fn qmv_norm_fits(&self, w: &QMat, also: Option<&QMat>) -> Result<bool> {
        let on_gemv =
            |w: &QMat| self.qgemm_path(w, 1) == QPath::Gemv && w.rows > 0 && w.w.ptr() != 0;
        if !on_gemv(w) {
            return Ok(false); // (K past the GEMV's, among others: rms_norm, then qgemm)
        }
        if let Some(b) = also {
            if b.ty != w.ty || b.cols != w.cols || !on_gemv(b) {
                return Ok(false);
            }
        }
        self.qmv_check(w.ty, w.rows, w.cols)?;
        let rows = w.rows + also.map_or(0, |b| b.rows);
        let v = self.one_vector_for(w.ty, rows, w.cols)?;
        let smem = v.smem_norm(w.cols);
        if !Self::has_norm_twin(v) || smem > self.max_smem_per_block {
            return Ok(false);
        }
        let name = format!("{}_norm", v.kernel(w.ty));
        Ok(self.resident_ctas(&name, 256, smem)?
            >= self.resident_ctas(&v.kernel(w.ty), 256, v.smem(w.cols))?)
    }

    /// The one-vector kernels with a `_norm` twin: [`QmvVariant::one_vector`]'s.
    fn has_norm_twin(v: QmvVariant) -> bool {
        v.wide && v.r == 2 && v.mt == 1
    }

    /// [`Gpu::qmv_norm`] on the `_norm` twin of kernel `v` (the op table runs each).
    pub fn qmv_norm_variant(
        &self,
        w: &QMat,
        n: QmvNorm,
        out: u64,
        also: Option<QmvAlso>,
        v: QmvVariant,
    ) -> Result<()> {
        self.qmv_check(w.ty, w.rows, w.cols)?;
        let smem = v.smem_norm(w.cols);
        let bulk_ok = !v.bulk || (w.ty == QType::Q4K && self.has_clusters());
        if !Self::has_norm_twin(v) || !bulk_ok || w.w.ptr() == 0 {
            return Err(CudaError::Invalid(format!(
                "qmv_norm: no norm twin of {v:?} for {:?}, or no device memory",
                w.ty
            )));
        }
        if let Some(a) = also {
            if a.w.ty != w.ty || a.w.cols != w.cols || a.w.w.ptr() == 0 {
                return Err(CudaError::Invalid(format!(
                    "qmv_norm: a second matrix {:?} [{} x {}] beside {:?} [{} x {}] (the same \
                     type and width, on the device)",
                    a.w.ty, a.w.rows, a.w.cols, w.ty, w.rows, w.cols
                )));
            }
        }
        if smem > self.max_smem_per_block {
            return Err(CudaError::Invalid(format!(
                "qmv_norm over width {}: {smem} bytes of shared memory (at most {})",
                w.cols, self.max_smem_per_block
            )));
        }
        let (w1, rows1, out1) = also.map_or((0, 0, 0), |a| (a.w.w.ptr(), a.w.rows, a.out));
        if w.rows + rows1 == 0 {
            return Ok(());
        }
        let name = format!("{}_norm", v.kernel(w.ty));
        // the groups of each matrix (a group never spans both)
        let grid = (v.blocks(w.rows) + v.blocks(rows1))
            .min(self.resident_ctas(&name, 256, smem)?)
            .max(1);
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (rows, k, r1) = (w.rows as i32, w.cols as i32, rows1 as i32);
        self.launch(
            &name,
            cfg,
            &args![
                w.w.ptr(),
                rows,
                k,
                out,
                n.x,
                n.gamma,
                n.eps,
                n.hnb,
                w1,
                r1,
                out1
            ],
        )
    }

    /// `out[r] = (out[r] + sum_j c.w[j] * c.y[j, r]) + W[r, :] . x[0, :]` for one token (x bf16
    /// `[1, cols]`, out f32 `[rows]`, c.k slots): bit for bit [`Gpu::moe_combine_pairs`] into out
    /// then [`Gpu::qmv`] accumulating, in one launch (the `_comb` twin of `qmv`'s kernel: the
    /// same walk, so the same sums). See [`Gpu::combine_fits`].
    pub fn qmv_combine(&self, w: &QMat, x: u64, out: u64, c: PairCombine) -> Result<()> {
        self.qmv_check(w.ty, w.rows, w.cols)?;
        if !self.combine_fits(w, 1, c.k) {
            return Err(CudaError::Invalid(format!(
                "qmv_combine over {w_ty:?} [{} x {}] with {} slots: 1..=32 slots, x in shared \
                 memory, MLASERVE_QMV_COMBINE and MLASERVE_QMV_WIDE on",
                w.rows,
                w.cols,
                c.k,
                w_ty = w.ty
            )));
        }
        if w.rows == 0 {
            return Ok(());
        }
        let v = self.qmv_one_vector(w)?;
        self.qmv_combine_variant(w, x, out, c, v, None)
    }

    /// [`Gpu::qmv_combine`] on an explicit kernel of [`QmvVariant::one_vector`] and an optional
    /// cap on the persistent grid (the op table sweeps these).
    pub fn qmv_combine_variant(
        &self,
        w: &QMat,
        x: u64,
        out: u64,
        c: PairCombine,
        v: QmvVariant,
        grid_cap: Option<usize>,
    ) -> Result<()> {
        self.qmv_check(w.ty, w.rows, w.cols)?;
        if !self.combine_fits(w, 1, c.k) || !self.one_vector_runs(w.ty, v) {
            return Err(CudaError::Invalid(format!(
                "qmv_combine on {v:?} with {} slots (a kernel of QmvVariant::one_vector that \
                 runs here, 1..=32 slots)",
                c.k
            )));
        }
        if w.rows == 0 {
            return Ok(());
        }
        let name = format!("{}_comb", v.kernel(w.ty));
        let epi = Epilogue::Combine(c);
        self.qmv_launch(&name, w, x, 0, 1, out, true, v, grid_cap, epi)
    }

    /// Whether [`Gpu::qmv_combine`] takes `m` rows of x against `w` with `k` slots: one row
    /// (the combine twins are one-vector kernels; at 2-4 tokens the combine stays a launch of
    /// its own), 1..=32 slots (a lane a slot), on the int8 GEMV's path (x in shared memory),
    /// `MLASERVE_QMV_COMBINE` on.
    pub fn combine_fits(&self, w: &QMat, m: usize, k: usize) -> bool {
        let tc = self.has_flash_attn();
        m == 1
            && (1..=32).contains(&k)
            && combine_allowed()
            && narrow_only(QmvVariant::PAIRS) == QmvVariant::PAIRS
            && QPath::choose(1, w.cols, self.max_smem_per_block, tc, w.mmq_from()) == QPath::Gemv
    }

    /// The kernel of one vector against `w`: two words a lane, on three CTAs an SM where they
    /// deal the row groups out more evenly ([`w3_evener`]).
    /// Q4_K on sm_90+ takes the bulk kernels ([`QmvVariant::BULK`]) instead, picked the same way.
    fn qmv_one_vector(&self, w: &QMat) -> Result<QmvVariant> {
        self.one_vector_for(w.ty, w.rows, w.cols)
    }

    /// [`Gpu::qmv_one_vector`] for a [rows, cols] matrix of `ty`.
    fn one_vector_for(&self, ty: QType, rows: usize, cols: usize) -> Result<QmvVariant> {
        let mut v = narrow_only(QmvVariant::wide(2, 1));
        if v != QmvVariant::wide(2, 1) {
            return Ok(v);
        }
        let bulk = ty == QType::Q4K && cols >= bulk_min_k() && self.has_clusters();
        let three = if bulk {
            v = QmvVariant::BULK;
            QmvVariant::BULK3
        } else {
            QmvVariant::WIDE3
        };
        if w3_allowed() {
            let warps = |v: QmvVariant| -> Result<usize> {
                Ok(8 * self.resident_ctas(&v.kernel(ty), 256, v.smem(cols))?)
            };
            if w3_evener(rows.div_ceil(2), warps(v)?, warps(three)?) {
                v = three;
            }
        }
        Ok(v)
    }

    /// [`Gpu::qmv`] with an explicit kernel and an optional cap on the persistent grid (the
    /// lab and the op table sweep these; a small cap makes each warp walk many row groups).
    #[allow(clippy::too_many_arguments)]
    pub fn qmv_variant(
        &self,
        w: &QMat,
        x: u64,
        row0: usize,
        m: usize,
        out: u64,
        accumulate: bool,
        v: QmvVariant,
        grid_cap: Option<usize>,
    ) -> Result<()> {
        self.qmv_check(w.ty, w.rows, w.cols)?;
        if m == 0 || w.rows == 0 {
            return Ok(());
        }
        if m > v.mt {
            return Err(CudaError::Invalid(format!(
                "qmv kernel {v:?} takes at most {} vectors, got {m}",
                v.mt
            )));
        }
        self.qmv_launch(
            &v.kernel(w.ty),
            w,
            x,
            row0,
            m,
            out,
            accumulate,
            v,
            grid_cap,
            Epilogue::Plain,
        )
    }

    /// Whether [`Gpu::qmv_glu`] and [`Gpu::qmv_pairs_glu`] run (`MLASERVE_QMV_GLU=0`: never,
    /// for comparisons; nor with `MLASERVE_QMV_WIDE=0`, whose kernels have no `_glu` twin).
    pub fn qmv_glu_on(&self) -> bool {
        glu_allowed()
    }

    /// `act[i] = bf16(silu(g_i) * u_i)` of `g = gate|up[i, :] . x[row0, :]` and `u =
    /// gate|up[f + i, :] . x[row0, :]`, the gate|up `w` `[2f, cols]` (x bf16): bit for bit
    /// [`Gpu::qmv`] into `[2f]` f32 then [`Gpu::silu_mul`], in one launch (the kernel's row
    /// groups are row pairs (i, f + i); the same kernel as `qmv`'s at one vector, so the same
    /// sums). act bf16 `[f]`.
    pub fn qmv_glu(&self, w: &QMat, x: u64, row0: usize, act: u64) -> Result<()> {
        let v = self.qmv_one_vector(w)?;
        self.qmv_glu_variant(w, x, row0, act, v, None)
    }

    /// [`Gpu::qmv_glu`] on an explicit kernel of [`QmvVariant::one_vector`] and an optional cap on
    /// the persistent grid (the op table sweeps these).
    pub fn qmv_glu_variant(
        &self,
        w: &QMat,
        x: u64,
        row0: usize,
        act: u64,
        v: QmvVariant,
        grid_cap: Option<usize>,
    ) -> Result<()> {
        self.qmv_check(w.ty, w.rows, w.cols)?;
        if !w.rows.is_multiple_of(2) || !glu_allowed() || !self.one_vector_runs(w.ty, v) {
            return Err(CudaError::Invalid(format!(
                "qmv_glu: a gate|up of {} rows on {v:?} (even rows, a kernel of \
                 QmvVariant::one_vector that runs here, MLASERVE_QMV_GLU and MLASERVE_QMV_WIDE \
                 on)",
                w.rows
            )));
        }
        if w.rows == 0 {
            return Ok(());
        }
        let name = format!("{}_glu", v.kernel(w.ty));
        let glu = Epilogue::Glu {
            f: w.rows / 2,
            act,
            views: SliceViews::NONE,
        };
        self.qmv_launch(&name, w, x, row0, 1, 0, false, v, grid_cap, glu)
    }

    /// act [m, f] = bf16(silu(gate) * up) of x [m, cols] (bf16) against the gate|up `w` [2f,
    /// cols], in one launch where one row takes the int8 GEMV ([`Gpu::qmv_glu`]; true), else
    /// nothing (false: the caller runs [`Gpu::qgemm`] then [`Gpu::silu_mul`]).
    pub fn qgemm_glu(&self, w: &QMat, m: usize, x: u64, act: u64) -> Result<bool> {
        let tc = self.has_flash_attn();
        if m != 1
            || !w.rows.is_multiple_of(2)
            || !glu_allowed()
            || QPath::choose(1, w.cols, self.max_smem_per_block, tc, w.mmq_from()) != QPath::Gemv
        {
            return Ok(false);
        }
        self.qmv_glu(w, x, 0, act)?;
        Ok(true)
    }

    /// A lab kernel of `qgemv.cu` (`lab_q4k_*`: Q4_K, one vector, shaped as `v`: a bulk lab
    /// kernel as [`QmvVariant::BULK`] or [`QmvVariant::BULK3`], its slots) on `w`, or
    /// any `qmv_*` kernel by name. examples/qgemv.rs only.
    #[allow(clippy::too_many_arguments)]
    pub fn qmv_lab(
        &self,
        name: &str,
        w: &QMat,
        x: u64,
        out: u64,
        v: QmvVariant,
        grid_cap: Option<usize>,
    ) -> Result<()> {
        self.qmv_check(w.ty, w.rows, w.cols)?;
        self.qmv_launch(name, w, x, 0, 1, out, false, v, grid_cap, Epilogue::Plain)
    }

    /// Whether `v` is a one-vector kernel with twins for `ty` that runs here (the bulk ones
    /// need sm_90's copies).
    pub fn one_vector_runs(&self, ty: QType, v: QmvVariant) -> bool {
        QmvVariant::one_vector(ty).contains(&v) && (!v.bulk || self.has_clusters())
    }

    /// [`even_grid`] for `w` on kernel `v` (the lab's even-grid runs).
    pub fn qmv_even_grid(&self, w: &QMat, v: QmvVariant) -> Result<usize> {
        let res = self.resident_ctas(&v.kernel(w.ty), 256, v.smem(w.cols))?;
        Ok(even_grid(w.rows.div_ceil(v.r), res))
    }

    #[allow(clippy::too_many_arguments)]
    fn qmv_launch(
        &self,
        name: &str,
        w: &QMat,
        x: u64,
        row0: usize,
        m: usize,
        out: u64,
        accumulate: bool,
        v: QmvVariant,
        grid_cap: Option<usize>,
        epi: Epilogue,
    ) -> Result<()> {
        let (rows, k, acc) = (w.rows as i32, w.cols as i32, accumulate as i32);
        let (glu_f, act, cy, cw, ck, sl_from, sl_up) = epi.args();
        let (xr, m32) = (row0 as i32, m as i32);
        let (w0, null, zero) = (w.w.ptr(), 0u64, 0i32);
        if w0 == 0 {
            // the kernel would store zeros, neither adding nor combining (qgemv.cu)
            return Err(CudaError::Invalid(format!(
                "qmv over a {:?} [{} x {}] without device memory",
                w.ty, w.rows, w.cols
            )));
        }
        if v.bulk && (w.ty != QType::Q4K || !self.has_clusters()) {
            return Err(CudaError::Invalid(format!(
                "{name}: a bulk kernel takes Q4_K on sm_90+ (got {:?} on {})",
                w.ty, self.arch
            )));
        }
        let smem = v.smem(w.cols);
        if smem > self.max_smem_per_block {
            return Err(CudaError::Invalid(format!(
                "{name} over width {}: {smem} bytes of shared memory (at most {})",
                w.cols, self.max_smem_per_block
            )));
        }
        let grid = v
            .blocks(w.rows)
            .min(self.resident_ctas(name, 256, smem)?)
            .min(grid_cap.unwrap_or(usize::MAX))
            .max(1);
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        self.launch(
            name,
            cfg,
            &args![
                null, w0, zero, zero, null, x, xr, rows, k, m32, acc, out, glu_f, act, cy, cw, ck,
                sl_from, sl_up
            ],
        )
    }

    fn qmv_check(&self, ty: QType, rows: usize, k: usize) -> Result<()> {
        if !k.is_multiple_of(ty.block_values()) || k > QMV_MAX_K || rows > i32::MAX as usize {
            return Err(CudaError::Invalid(format!(
                "qmv: {ty:?} [{rows} x {k}]: K must be a multiple of {} and at most {QMV_MAX_K}",
                ty.block_values()
            )));
        }
        Ok(())
    }

    /// CTAs of `threads` threads of kernel `name` with `smem` bytes of dynamic shared memory
    /// resident on the whole GPU at once (cached).
    pub(crate) fn resident_ctas(&self, name: &str, threads: usize, smem: usize) -> Result<usize> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        type Key = (usize, String, usize, usize);
        static CACHE: OnceLock<Mutex<HashMap<Key, usize>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        let key = (self.ordinal, name.to_string(), threads, smem);
        if let Some(&n) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(n);
        }
        if smem > 48 << 10 {
            let name: &'static str = crate::kernels::NAMES
                .iter()
                .find(|n| **n == name)
                .ok_or_else(|| CudaError::Invalid(format!("no kernel {name}")))?;
            self.raise_smem(name, self.max_smem_per_block)?;
        }
        let per_sm = self
            .func(name)?
            .occupancy_max_active_blocks_per_multiprocessor(threads as u32, smem, None)
            .map_err(|e| CudaError::driver(format!("occupancy of {name}"), e))?;
        let n = (per_sm.max(1) as usize) * self.sm_count.max(1);
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        Ok(n)
    }

    /// Expert GEMV over pairs: out[p, :rows] = W_{ids[p]} . x[p / x_div, :] for every pair p,
    /// x bf16 [*, k]; `w_ptrs` [held] pointers to [rows, k] matrices of `ty` (index
    /// ids[p] - first; a pair whose expert is not held, or has a null pointer, gets zeros).
    #[allow(clippy::too_many_arguments)]
    pub fn qmv_pairs(
        &self,
        ty: QType,
        pairs: usize,
        w_ptrs: u64,
        first: usize,
        held: usize,
        ids: u64,
        x: u64,
        k: usize,
        x_div: usize,
        rows: usize,
        out: u64,
    ) -> Result<()> {
        let p = (pairs, w_ptrs, first, held, ids);
        self.qmv_pairs_after(ty, p, x, k, x_div, rows, out, false)
    }

    /// [`Gpu::qmv_pairs`] with its pair arguments as one tuple `p` = (pairs, w_ptrs, first,
    /// held, ids); `ids_final` (the caller vouches that every block of each kernel
    /// since the one that wrote `ids` waited before letting the next kernel in — the expert
    /// down GEMV after the gate|up one over the same ids): each pair's matrix is looked up and
    /// its first steps requested before the wait, beside the kernel before's tail
    /// (qgemv.cu). The same sums. `MLASERVE_QMV_PAIRS_EARLY=0`: never, for comparisons.
    #[allow(clippy::too_many_arguments)]
    pub fn qmv_pairs_after(
        &self,
        ty: QType,
        p: (usize, u64, usize, usize, u64),
        x: u64,
        k: usize,
        x_div: usize,
        rows: usize,
        out: u64,
        ids_final: bool,
    ) -> Result<()> {
        let v = pairs_kernel(false);
        self.qmv_pairs_launch(ty, p, x, k, x_div, rows, out, Epilogue::Plain, ids_final, v)
    }

    /// [`Gpu::qmv_pairs`] on an explicit kernel `v` ([`QmvVariant::PAIRS`] or
    /// [`QmvVariant::WIDE3`]), with the SwiGLU epilogue of [`Gpu::qmv_pairs_glu`] into
    /// `glu` = (f, act) where given (`rows` is then 2f): the op table checks the kernels
    /// against each other bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn qmv_pairs_variant(
        &self,
        ty: QType,
        p: (usize, u64, usize, usize, u64),
        x: u64,
        k: usize,
        x_div: usize,
        rows: usize,
        out: u64,
        glu: Option<(usize, u64)>,
        v: QmvVariant,
    ) -> Result<()> {
        if v != QmvVariant::PAIRS && v != QmvVariant::WIDE3 {
            return Err(CudaError::Invalid(format!(
                "qmv_pairs_variant: {v:?} (PAIRS or WIDE3)"
            )));
        }
        let epi = match glu {
            Some((f, act)) if glu_allowed() && rows == 2 * f => Epilogue::Glu {
                f,
                act,
                views: SliceViews::NONE,
            },
            Some((f, _)) => {
                return Err(CudaError::Invalid(format!(
                    "qmv_pairs_variant: the SwiGLU epilogue over {rows} rows, f = {f} (2f rows, \
                     MLASERVE_QMV_GLU and MLASERVE_QMV_WIDE on)"
                )))
            }
            None => Epilogue::Plain,
        };
        self.qmv_pairs_launch(ty, p, x, k, x_div, rows, out, epi, false, v)
    }

    /// [`Gpu::qmv_pairs`] over gate|up matrices [2f, k] with the SwiGLU epilogue of
    /// [`Gpu::qmv_glu`]: act[p, i] = bf16(silu(g) * u) of pair p's rows i and f + i, bit for
    /// bit `qmv_pairs` over 2f rows then [`Gpu::silu_mul`]. act bf16 [pairs, f]; `p` =
    /// (pairs, w_ptrs, first, held, ids) as [`Gpu::qmv_pairs_after`] takes it. Id
    /// `views.e_routed + j` is the shared expert's slice j: its table entry is
    /// [`QMat::row_ptr`] of row j * f of the shared [2 views.fs, k] gate|up, its up rows
    /// views.fs further (weights.rs, `GMoe::slices`), so a token's slices make the shared
    /// MLP's intermediate, the same bits as [`Gpu::qmv_glu`] over the whole matrix — on the
    /// two-CTA kernel whatever `MLASERVE_QMV_PAIRS_W3` says (the three-CTA one has no slices:
    /// qgemv.cu's SLICES).
    #[allow(clippy::too_many_arguments)]
    pub fn qmv_pairs_glu(
        &self,
        ty: QType,
        p: (usize, u64, usize, usize, u64),
        x: u64,
        k: usize,
        x_div: usize,
        f: usize,
        views: SliceViews,
        act: u64,
    ) -> Result<()> {
        if !glu_allowed() {
            return Err(CudaError::Invalid(
                "qmv_pairs_glu with MLASERVE_QMV_GLU=0 or MLASERVE_QMV_WIDE=0".into(),
            ));
        }
        if views.has_slices() && (views.fs < f || !views.fs.is_multiple_of(f)) {
            return Err(CudaError::Invalid(format!(
                "qmv_pairs_glu: shared-expert slices of intermediate {} (a multiple of one \
                 expert's {f})",
                views.fs
            )));
        }
        let epi = Epilogue::Glu { f, act, views };
        let v = if views.has_slices() {
            QmvVariant::PAIRS
        } else {
            pairs_kernel(true)
        };
        self.qmv_pairs_launch(ty, p, x, k, x_div, 2 * f, 0, epi, false, v)
    }

    #[allow(clippy::too_many_arguments)]
    fn qmv_pairs_launch(
        &self,
        ty: QType,
        (pairs, w_ptrs, first, held, ids): (usize, u64, usize, usize, u64),
        x: u64,
        k: usize,
        x_div: usize,
        rows: usize,
        out: u64,
        epi: Epilogue,
        ids_final: bool,
        v: QmvVariant,
    ) -> Result<()> {
        self.qmv_check(ty, rows, k)?;
        if pairs == 0 || rows == 0 {
            return Ok(());
        }
        if pairs > 65_535 || x_div == 0 {
            return Err(CudaError::Invalid(format!(
                "qmv_pairs: {pairs} pairs (at most 65,535), x_div {x_div}"
            )));
        }
        let name = match epi {
            Epilogue::Glu { .. } => format!("{}_glu", v.kernel(ty)),
            _ => v.kernel(ty),
        };
        let (glu_f, act, cy, cw, ck, sl_from, sl_up) = epi.args();
        let smem = v.smem(k);
        // Persistent over row groups, the pairs side by side.
        let grid = v
            .blocks(rows)
            .min(self.resident_ctas(&name, 256, smem)?.div_ceil(pairs))
            .max(1);
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, pairs as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (f, h, xd) = (first as i32, held as i32, x_div as i32);
        let (r32, k32, one) = (rows as i32, k as i32, 1i32);
        // accumulate: pairs never add into out; bit 1, their ids are final (qgemv.cu)
        let flags = ((ids_final && pairs_early()) as i32) << 1;
        self.launch(
            &name,
            cfg,
            &args![
                w_ptrs, 0u64, f, h, ids, x, xd, r32, k32, one, flags, out, glu_f, act, cy, cw, ck,
                sl_from, sl_up
            ],
        )
    }

    /// out [rows, cols] bf16 = the dequantized rows of `w` (16-byte aligned `out`).
    pub fn dequant_bf16(&self, w: &QMat, out: u64) -> Result<()> {
        self.dequant_rows_bf16(w, 0, w.rows, out)
    }

    /// out [n, cols] bf16 = rows r0 .. r0 + n of `w`, dequantized (16-byte aligned `out`).
    pub fn dequant_rows_bf16(&self, w: &QMat, r0: usize, n: usize, out: u64) -> Result<()> {
        if !out.is_multiple_of(16) || r0 + n > w.rows {
            return Err(CudaError::Invalid(format!(
                "dequant_rows_bf16: rows {r0}..{} of {} into {out:#x} (16-byte aligned)",
                r0 + n,
                w.rows
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let (k, n32) = (w.cols as i32, n as i32);
        match w.ty {
            QType::Q8_0 => {
                let q = w.w.ptr() + (r0 * w.cols) as u64;
                let d = w.w.ptr() + (w.rows * w.cols + r0 * (w.cols / 32) * 2) as u64;
                let grid = (n * w.cols / 16).div_ceil(256).clamp(1, 65_535) as u32;
                self.launch(
                    "dequant_q8_0_bf16",
                    Gpu::cfg((grid, 1, 1), 256),
                    &args![q, d, out, n32, k],
                )
            }
            QType::Q4K => {
                let wp = w.w.ptr() + (r0 * w.ty.row_bytes(w.cols)) as u64;
                let grid = (n * (w.cols / 256) * 8).div_ceil(256).clamp(1, 65_535) as u32;
                self.launch(
                    "dequant_q4_k_bf16",
                    Gpu::cfg((grid, 1, 1), 256),
                    &args![wp, out, n32, k],
                )
            }
        }
    }

    /// How [`Gpu::qgemm`] computes `m` rows of x against `w` on this GPU.
    pub fn qgemm_path(&self, w: &QMat, m: usize) -> QPath {
        let tc = self.has_flash_attn();
        QPath::choose(m, w.cols, self.max_smem_per_block, tc, w.mmq_from())
    }

    /// out[M, rows] (+)= x[M, cols] . W^T for any M, x bf16 [M, cols], by [`QPath::choose`]:
    /// the int8 GEMV over x quantized per 32 values or the int8 tensor-core kernel over x
    /// quantized as `qmmq::x_q8u` says (Q8_0 per 32 values; Q4_K a scale a chunk and a factor
    /// a sub-block, so for Q4_K the rows of x at which the path changes also change x's
    /// rounding, not only the summation order); the tensor-core kernel dequantizing weight
    /// tiles in shared memory; else W dequantized in row chunks to a bf16 scratch (reserved,
    /// or the step arena) and cuBLAS.
    pub fn qgemm(&self, w: &QMat, m: usize, x: u64, out: u64, accumulate: bool) -> Result<()> {
        if m == 0 {
            return Ok(());
        }
        match self.qgemm_path(w, m) {
            QPath::Gemv => {
                for r0 in (0..m).step_by(QmvVariant::MAX_M) {
                    let n = (m - r0).min(QmvVariant::MAX_M);
                    self.qmv(w, x, r0, n, out + (r0 * w.rows * 4) as u64, accumulate)?;
                }
                return Ok(());
            }
            QPath::Mmq => return self.qgemm_mmq(w, m, x, out, accumulate),
            QPath::TensorCore => return self.qgemm_tc(w, m, x, out, accumulate),
            QPath::Dequantize => {}
        }
        // Row chunks of at most DEQUANT_CHUNK elements through the reserved scratch (one
        // stream orders the reuse), or through the step arena before it is reserved.
        let chunk_rows = (DEQUANT_CHUNK / w.cols).max(1).min(w.rows);
        let tmp;
        let scratch = match self.dequant_scratch.get() {
            Some(s) if s.len() >= chunk_rows * w.cols => s.ptr(),
            _ => {
                tmp = self.alloc::<u16>(chunk_rows * w.cols)?;
                tmp.ptr()
            }
        };
        for r0 in (0..w.rows).step_by(chunk_rows) {
            let n = (w.rows - r0).min(chunk_rows);
            self.dequant_rows_bf16(w, r0, n, scratch)?;
            let mut g = Gemm::plain(
                GemmType::Bf16,
                m,
                n,
                w.cols,
                x,
                scratch,
                out + 4 * r0 as u64,
            );
            g.ldo = w.rows;
            self.gemm(&if accumulate { g.accumulate() } else { g })?;
        }
        Ok(())
    }

    /// Reserves the scratch of [`Gpu::qgemm`] (call before capturing graphs; idempotent).
    pub fn reserve_dequant_scratch(&self) -> Result<()> {
        if self.dequant_scratch.get().is_none() {
            let s = self.alloc_persistent::<u16>(DEQUANT_CHUNK)?;
            let _ = self.dequant_scratch.set(s);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_kernels_and_twins_are_instantiated_with_their_slots() {
        for v in [QmvVariant::BULK, QmvVariant::BULK3] {
            let name = v.kernel(QType::Q4K);
            let suf = name.strip_prefix("qmv_q4_k_r2m1").unwrap();
            for (twin, glu, comb) in [
                ("", false, false),
                ("_glu", true, false),
                ("_comb", false, true),
            ] {
                let n = format!("{name}{twin}");
                assert!(crate::kernels::NAMES.contains(&n.as_str()), "{n}");
                let want = format!(
                    "QMV_ENTRY_B({}, {}, {suf}{twin}, {glu}, {comb})",
                    v.slots(),
                    v.ctas
                );
                assert!(
                    crate::kernels::SOURCE.lines().any(|l| l == want),
                    "{want} not instantiated"
                );
            }
        }
        assert!(QmvVariant::one_vector(QType::Q4K).contains(&QmvVariant::BULK));
        assert!(!QmvVariant::one_vector(QType::Q8_0).iter().any(|v| v.bulk));
    }

    #[test]
    fn every_variant_is_a_loaded_kernel() {
        for ty in [QType::Q8_0, QType::Q4K] {
            for v in QmvVariant::ALL {
                let name = v.kernel(ty);
                assert!(crate::kernels::NAMES.contains(&name.as_str()), "{name}");
                let ty_macro = if ty == QType::Q8_0 {
                    "QT_Q8_0"
                } else {
                    "QT_Q4_K"
                };
                let nq = if v.wide { 2 } else { 1 };
                let suf = name.rsplit_once(&format!("m{}", v.mt)).unwrap().1;
                let entry = format!("QMV_ENTRY({}, {ty_macro}, {}, {}, ", ty.tag(), v.r, v.mt);
                let tail = format!(", {}, {nq}, {suf})", v.ctas);
                let line = crate::kernels::SOURCE
                    .lines()
                    .find(|l| l.starts_with(&entry) && l.ends_with(&tail))
                    .unwrap_or_else(|| panic!("{entry}..{tail} not instantiated"));
                // its twins walk as it does: the same steps in flight (DEPTH) and CTAs an SM
                let depth = line[entry.len()..].split(',').next().unwrap().trim();
                if QmvVariant::ONE_VECTOR.contains(&v) {
                    let (tag, c) = (ty.tag(), v.ctas);
                    for (twin, want) in [
                        (
                            format!("{name}_comb"),
                            format!("QMV_ENTRY_C({tag}, {ty_macro}, {depth}, {c}, {suf})"),
                        ),
                        (
                            format!("{name}_glu"),
                            format!(
                                "QMV_ENTRY_G({tag}, {ty_macro}, {}, {}, {depth}, {c}, {nq}, \
                                 {suf}_glu, true)",
                                v.r, v.mt
                            ),
                        ),
                    ] {
                        assert!(crate::kernels::NAMES.contains(&twin.as_str()), "{twin}");
                        assert!(
                            crate::kernels::SOURCE.lines().any(|l| l == want),
                            "{want} not instantiated"
                        );
                    }
                }
            }
        }
        for ty in [QType::Q8_0, QType::Q4K] {
            for m in 1..=QmvVariant::MAX_M {
                let v = QmvVariant::for_m(ty, m).unwrap();
                assert!(
                    QmvVariant::ALL.contains(&v) && v.mt >= m,
                    "{ty:?} {m}: {v:?}"
                );
                // Every kernel's narrow twin exists (MLASERVE_QMV_WIDE=0).
                assert!(
                    QmvVariant::ALL.contains(&QmvVariant::narrow(v.r, v.mt)),
                    "{v:?}"
                );
            }
            assert!(QmvVariant::for_m(ty, 0).is_none() && QmvVariant::for_m(ty, 9).is_none());
        }
        let p = QmvVariant::PAIRS;
        assert!(QmvVariant::ALL.contains(&QmvVariant::narrow(p.r, p.mt)));
        assert!(QmvVariant::ALL.contains(&QmvVariant::PAIRS));
    }

    #[test]
    fn three_ctas_only_where_they_deal_groups_out_more_evenly() {
        // H200: 132 SMs, 8 warps a CTA.
        let (w2, w3) = (132 * 8 * 2, 132 * 8 * 3);
        assert!(w3_evener(18432 / 2, w2, w3)); // V3 gate/up: 0.87 -> 0.97
        assert!(!w3_evener(7168 / 2, w2, w3)); // V3 down: 0.85 -> 0.57
        assert!(!w3_evener(21888 / 2, w2, w3)); // V2-Lite gate_up: 0.86 both
        assert!(!w3_evener(3072 / 2, w2, w3)); // one round: fewer warps busy
        assert!(!w3_evener(0, w2, w3));
        assert!((evenness(4, 4) - 1.0).abs() < 1e-12 && (evenness(5, 4) - 0.625).abs() < 1e-12);
    }

    #[test]
    fn even_grids_give_every_warp_the_same_groups_or_one_fewer() {
        // H200, two CTAs an SM: 264 resident.
        assert_eq!(even_grid(7168 / 2, 264), 224); // V3 down: 2 groups a warp
        assert_eq!(even_grid(18432 / 2, 264), 231); // V3 gate/up: 5 rounds, 1,843.2 warps
        assert_eq!(even_grid(100, 264), 13); // one round: the warps the groups need
        assert_eq!(even_grid(8 * 264, 264), 264); // exactly full
        assert_eq!(even_grid(0, 264), 1);
        assert_eq!(even_grid(5, 0), 1);
        for groups in [1usize, 7, 2112, 2113, 3584, 9216, 10944] {
            let ctas = even_grid(groups, 264);
            let warps = 8 * ctas;
            let rounds = groups.div_ceil(8 * 264);
            assert!(ctas <= 264 && groups.div_ceil(warps) == rounds, "{groups}");
        }
    }

    #[test]
    fn qgemm_paths_follow_rows_of_x_and_shared_memory() {
        use QPath::*;
        let h200 = 227 << 10;
        let from = Some(QMMQ_FROM_M);
        let path = |m, _rows: usize, k| QPath::choose(m, k, h200, true, from);
        // 1-8 rows: the GEMV while 8 rows of x leave room for two blocks (K = 10,944: 109 KB),
        // from QMMQ_FROM_M rows the int8 tensor-core kernel where K % 256 == 0.
        assert_eq!(path(1, 3072, 2048), Gemv);
        assert_eq!(path(QMMQ_FROM_M - 1, 3072, 2048), Gemv);
        assert_eq!(path(QMMQ_FROM_M, 3072, 2048), Mmq);
        assert_eq!(path(8, 2048, 10944), Gemv);
        // 8 rows of K = 18,432 would take 184 KB (one block per SM); one row still fits.
        assert_eq!(path(8, 7168, 18432), Mmq);
        assert_eq!(path(1, 7168, 18432), Gemv);
        // Past the GEMV's rows the int8 tensor-core kernel up to 64 where K % 256 == 0, else
        // the bf16 one; then cuBLAS.
        assert_eq!(path(9, 3072, 2048), Mmq);
        assert_eq!(path(64, 3072, 2048), Mmq);
        assert_eq!(path(9, 3072, 2080), TensorCore);
        assert_eq!(path(64, 3072, 10944), TensorCore);
        assert_eq!(path(65, 3072, 2048), Dequantize);
        // K past the GEMV's limit.
        assert_eq!(path(1, 64, QMV_MAX_K + 256), Mmq);
        assert_eq!(path(1, 64, QMV_MAX_K + 32), TensorCore);
        // Large Q4_K matrices from QMMQ_Q4K_EARLY_M rows, small ones and Q8_0 from 5 (the
        // rule, where MLASERVE_QMMQ does not override it).
        use crate::qmmq::{mmq_from, QMMQ_Q4K_EARLY_M};
        if std::env::var_os("MLASERVE_QMMQ").is_none() {
            assert_eq!(mmq_from(QType::Q4K, 21888, 2048), Some(QMMQ_Q4K_EARLY_M));
            assert_eq!(mmq_from(QType::Q4K, 2048, 2048), Some(QMMQ_FROM_M));
            assert_eq!(mmq_from(QType::Q8_0, 21888, 2048), Some(QMMQ_FROM_M));
        }
        let q4k = |m, k| QPath::choose(m, k, h200, true, Some(QMMQ_Q4K_EARLY_M));
        assert_eq!(q4k(QMMQ_Q4K_EARLY_M - 1, 2048), Gemv);
        assert_eq!(q4k(QMMQ_Q4K_EARLY_M, 2048), Mmq);
        assert_eq!(q4k(QMMQ_Q4K_EARLY_M, 2080), Gemv);
        // MLASERVE_QMMQ=0: never (the GEMV, then the bf16 tensor-core kernel).
        assert_eq!(QPath::choose(8, 2048, h200, true, None), Gemv);
        assert_eq!(QPath::choose(9, 2048, h200, true, None), TensorCore);
        // Without tensor cores (pre-sm_80, 96 KB): GEMVs up to 32 rows where they fit.
        let old = |m, k| QPath::choose(m, k, 96 << 10, false, from);
        assert_eq!(old(1, QMV_MAX_K + 256), Dequantize);
        assert_eq!(old(12, 2048), Gemv);
        assert_eq!(old(32, 2048), Gemv);
        assert_eq!(old(33, 2048), Dequantize);
        assert_eq!(old(8, 18432), Dequantize);
    }

    #[test]
    fn q8_0_repack_splits_quants_and_scales() {
        // 2 rows x 64 columns: 4 blocks, scale bytes (i, 0x3c), quants 10 * i + j.
        let mut blocks = Vec::new();
        for i in 0..4u8 {
            blocks.extend_from_slice(&[i, 0x3c]);
            blocks.extend((0..32u8).map(|j| 10 * i + j));
        }
        let r = repack_q8_0(2, 64, &blocks);
        assert_eq!(r.len(), 4 * 34);
        for i in 0..4usize {
            for j in 0..32usize {
                assert_eq!(r[32 * i + j], (10 * i + j) as u8);
            }
            assert_eq!(&r[128 + 2 * i..130 + 2 * i], &[i as u8, 0x3c]);
        }
    }
}
