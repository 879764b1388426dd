//! Dense bf16 GEMV for decode steps (`kernels/gemv.cu`): M = 1..4 rows of x against one or two
//! weight matrices in one launch. It replaces cuBLAS where cuBLAS is far from the copy ceiling
//! (7-52% on V2-Lite's attention and shared-expert projections at M = 1, bench/cuda/
//! decode_profile.md), fuses the RMSNorm that makes x where the caller asks (q_proj|q_a and
//! kv_a_proj read the same normalized rows), and (where asked, for comparisons) prefetches its
//! weight rows into L2 before it waits for the previous kernel (`MLA_WEIGHTS_FIRST`, common.cuh).
//!
//! Invariants: x rows sit in shared memory (M * K bf16 <= [`GEMV_MAX_SMEM`]); K is a multiple
//! of 8 and every pointer 16-byte aligned (the kernel's vector loads); with a norm the bf16
//! rows are bit-identical to [`Gpu::rms_norm`]'s, so `hnb` can stand in for its output.

use crate::args;
use crate::error::{CudaError, Result};
use crate::gpu::Gpu;
use cudarc::driver::LaunchConfig;
use std::sync::OnceLock;

/// Most rows of x per launch.
pub const GEMV_MAX_M: usize = 4;
/// Shared memory for x (the default 48 KiB per block, no opt-in).
pub const GEMV_MAX_SMEM: usize = 48 * 1024;

/// What the GEMV multiplies.
#[derive(Clone, Copy, Debug)]
pub enum GemvX {
    /// bf16 rows [M, K].
    Bf16(u64),
    /// bf16(RMSNorm(x) * gamma) of f32 rows x [M, K]; `hnb` (0: none) receives those rows.
    Norm {
        x: u64,
        gamma: u64,
        eps: f32,
        hnb: u64,
    },
}

/// One weight matrix W bf16 [rows, K] and its output f32 [M, rows] (row stride `ld`).
#[derive(Clone, Copy, Debug)]
pub struct GemvMat {
    pub w: u64,
    pub rows: usize,
    pub out: u64,
    pub ld: usize,
}

/// Whether the GEMV takes M rows of width K.
pub fn gemv_fits(m: usize, k: usize) -> bool {
    (1..=GEMV_MAX_M).contains(&m) && k > 0 && k.is_multiple_of(8) && m * k * 2 <= GEMV_MAX_SMEM
}

/// The L2 prefetch of the block's rows before the wait: off by default, since it made the
/// V2-Lite step slower at M = 1 and 2 and no faster at 3 and 4 (`decode_profile --replays
/// 300`, µs a step without / with: b1 2,146.6 / 2,175.2 in session 11; b2 3,288.2 / 3,376.6,
/// b3 4,168.5 / 4,168.6, b4 4,784.7 / 4,784.4 in session 12). `MLASERVE_GEMV_PREFETCH=1`:
/// at every M (comparisons).
fn prefetch() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLASERVE_GEMV_PREFETCH").is_ok_and(|v| v == "1"))
}

impl Gpu {
    /// out_j (= or, with `acc`, +=) x · W_j^T for the one or two matrices of `mats`.
    pub fn gemv_bf16(
        &self,
        m: usize,
        k: usize,
        x: GemvX,
        mats: &[GemvMat],
        acc: bool,
    ) -> Result<()> {
        if !gemv_fits(m, k) || mats.is_empty() || mats.len() > 2 {
            return Err(CudaError::Invalid(format!(
                "gemv_bf16: M {m} (1..={GEMV_MAX_M}), K {k} (a multiple of 8, M*K*2 <= \
                 {GEMV_MAX_SMEM}), {} matrices (1 or 2)",
                mats.len()
            )));
        }
        let none = GemvMat {
            w: 0,
            rows: 0,
            out: 0,
            ld: 0,
        };
        let (a, b) = (mats[0], mats.get(1).copied().unwrap_or(none));
        let rows = a.rows + b.rows;
        if rows == 0 {
            return Ok(());
        }
        let (xf, gamma, eps, xb, hnb) = match x {
            GemvX::Bf16(p) => (0u64, 0u64, 0f32, p, 0u64),
            GemvX::Norm { x, gamma, eps, hnb } => (x, gamma, eps, 0, hnb),
        };
        let name = match m {
            1 => "gemv_bf16_m1",
            2 => "gemv_bf16_m2",
            _ => "gemv_bf16_m4",
        };
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(16) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (m * k * 2) as u32,
        };
        let (k32, m32, r0, ld0, r1, ld1) = (
            k as i32,
            m as i32,
            a.rows as i32,
            a.ld as i32,
            b.rows as i32,
            b.ld as i32,
        );
        let (acc, pf) = (acc as i32, prefetch() as i32);
        self.launch(
            name,
            cfg,
            &args![
                xf, gamma, eps, xb, k32, m32, a.w, r0, a.out, ld0, b.w, r1, b.out, ld1, acc, hnb,
                pf
            ],
        )
    }
}
