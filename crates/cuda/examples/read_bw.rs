//! Kernel lab: the GPU's read ceiling, and how close the b1 step's expert GEMVs stream to it
//! (`kernels/lab.cu`'s `lab_read_*`, `lab_rows_*`, `lab_copy`; `kernels/moe.cu`).
//!
//! Issue #11's roofline divides a step's bytes by the device copy's 3,970 GB/s (bytes read +
//! written, ../shared/design/gpu.md), and the expert kernels stream within ~5% of it. A kernel
//! that only reads may stream faster than a copy; if it does, the expert GEMVs (92 + 46 MB a
//! MoE layer at b1, ~60% of the step) have that much left. Measured here, on one pool of
//! device memory with each launch's bytes taken at a rotating offset (so L2 holds none):
//!
//! 1. pure reads (`lab_read_u{1,4,8}[h]`: U 16-byte loads a thread in flight, `h` with an L2
//!    256-byte prefetch hint), grid-stride over 92 MB (a `moe_gemv_swiglu`'s bytes) and 1 GiB,
//!    at 2, 4 and 8 blocks of 256 threads an SM;
//! 2. the expert GEMV's access pattern without its arithmetic (`lab_rows_s{4,8}[p]`: a warp a
//!    row pair of 2,048 bf16, 4 or 8 K steps in flight; a block of 8 warps a row group as the
//!    GEMV's grid, or `p` a persistent grid);
//! 3. the copy gpu.md's ceiling was measured with (bytes read + written);
//! 4. `moe_gemv_swiglu` and `moe_gemv_combine` as the b1 step launches them (8 pairs of 64
//!    experts of V2-Lite's shape: gate|up [2816, 2048], down [2048, 1408]; the ids rotate over
//!    the experts), alone and as the step's pair; before them `moe_gemv_swiglu` taken apart
//!    (`lab_swiglu_m{0,1,2}`: its loads alone, with its arithmetic, with its lookup of the
//!    matrix after the wait);
//! 5. the dense bf16 GEMV at one row on lm_head and layer 0's MLP (the step's other large reads).
//!
//! Every launch carries PDL as the engine's do, back to back between CUDA events (median of
//! 15 batches, `common::time_us`). GB/s = bytes a launch / µs a launch.
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example read_bw
//! MLASERVE_KERNEL_DEFINES=-DMOE_STEPS=8 ...   (the expert GEMVs with 8 K steps in flight)
//! ```

#[path = "common/mod.rs"]
mod common;

use mlaserve_cuda::gemv::{GemvMat, GemvX};
use mlaserve_cuda::gpu::Arg;
use mlaserve_cuda::ops::SliceViews;
use mlaserve_cuda::Gpu;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const MB: f64 = 1e6;

fn row(label: &str, bytes: usize, us: f64) {
    println!(
        "{label:<48} {:>9.1} MB {:>9.2} µs {:>8.0} GB/s",
        bytes as f64 / MB,
        us,
        bytes as f64 / us / 1e3
    );
}

fn main() -> Res<()> {
    let gpu = Gpu::new(0)?;
    let sm = gpu.sm_count as u32;
    let pool_bytes: usize = 2 << 30;
    let pool = gpu.alloc_filled::<u8>(pool_bytes, 0x3c)?; // bf16 0x3c3c: finite everywhere
    let dst = gpu.alloc::<u8>(512 << 20)?;
    let sink = gpu.alloc::<u32>(1)?;
    println!(
        "{} SMs; pool {} MiB; block 256 threads",
        sm,
        pool_bytes >> 20
    );

    // 1. Pure reads.
    // V2-Lite's experts: 64 of gate|up [2f, h] and down [h, f]; a b1 MoE layer reads 8.
    let (e, f, h) = (64usize, 1408usize, 2048usize);
    let gu_bytes = 2 * f * h * 2;
    let dn_bytes = h * f * 2;
    let swiglu_bytes = 8 * gu_bytes; // 92.3 MB
    for &(bytes, per) in &[(swiglu_bytes, 20usize), (1usize << 30, 3)] {
        let slots = pool_bytes / bytes;
        for (name, bps) in [
            ("lab_read_u1", 8u32),
            ("lab_read_u4", 2),
            ("lab_read_u4", 4),
            ("lab_read_u4", 8),
            ("lab_read_u8", 2),
            ("lab_read_u8", 4),
            ("lab_read_u4h", 4),
            ("lab_read_u8h", 4),
        ] {
            let run = |i: usize| {
                let src = pool.ptr() + ((i % slots) * bytes) as u64;
                let args = [Arg::P(src), Arg::L((bytes / 16) as i64), Arg::P(sink.ptr())];
                gpu.launch(name, Gpu::cfg((sm * bps, 1, 1), 256), &args)
            };
            let us = common::time_us(&gpu, &run, 3, 15, per)?;
            row(&format!("{name} x {bps} blocks/SM"), bytes, us);
        }
    }

    // 2. The GEMV's access pattern: row pairs of 2,048 bf16.
    let n = h;
    let rows = swiglu_bytes / (2 * n);
    let slots = pool_bytes / swiglu_bytes;
    for (name, grid) in [
        ("lab_rows_s4", (rows / 16) as u32),
        ("lab_rows_s8", (rows / 16) as u32),
        ("lab_rows_s4p", sm * 4),
        ("lab_rows_s8p", sm * 2),
    ] {
        let run = |i: usize| {
            let src = pool.ptr() + ((i % slots) * swiglu_bytes) as u64;
            let args = [
                Arg::P(src),
                Arg::I(rows as i32),
                Arg::I(n as i32),
                Arg::P(sink.ptr()),
            ];
            gpu.launch(name, Gpu::cfg((grid, 1, 1), 256), &args)
        };
        let us = common::time_us(&gpu, &run, 3, 15, 20)?;
        row(&format!("{name} grid {grid}"), swiglu_bytes, us);
    }

    // 3. The copy (bytes read + written), 512 MiB each way.
    {
        let half = 512usize << 20;
        let slots = pool_bytes / half;
        let run = |i: usize| {
            let src = pool.ptr() + ((i % slots) * half) as u64;
            let args = [Arg::P(src), Arg::P(dst.ptr()), Arg::L((half / 16) as i64)];
            gpu.launch("lab_copy", Gpu::cfg((sm * 8, 1, 1), 256), &args)
        };
        let us = common::time_us(&gpu, &run, 3, 15, 3)?;
        row("lab_copy x 8 blocks/SM (read + written)", 2 * half, us);
    }

    // 4. The expert GEMVs as the b1 step launches them: 8 pairs (6 routed + 2 shared slices
    //    in the engine; here 8 distinct experts of 64), x_div 8, no early slices.
    let gu_base = pool.ptr();
    let dn_base = pool.ptr() + (e * gu_bytes) as u64;
    let gu_tab: Vec<u64> = (0..e).map(|j| gu_base + (j * gu_bytes) as u64).collect();
    let dn_tab: Vec<u64> = (0..e).map(|j| dn_base + (j * dn_bytes) as u64).collect();
    let gu_ptrs = gpu.upload(&gu_tab)?;
    let dn_ptrs = gpu.upload(&dn_tab)?;
    // ids: 8 sets of 8 distinct experts (a permutation of the 64 cut in eighths), one set a
    // launch.
    let ids_h: Vec<i32> = (0..e).map(|j| ((j * 37) % e) as i32).collect();
    let ids = gpu.upload(&ids_h)?;
    // the lab kernels' sets in memory order (set s: experts 8s .. 8s + 7)
    let ids_seq = gpu.upload(&(0..e as i32).collect::<Vec<i32>>())?;
    let x = gpu.upload(&common::random_bf16(h, 7))?;
    let act = gpu.alloc::<u16>(8 * f)?;
    let wts = gpu.upload(&[0.125f32; 8])?;
    let xo = gpu.alloc::<f32>(h)?;
    gpu.zero(&xo)?;
    // (the engine's launchers, as the executor calls them at b1: no shared slices here)
    let views = SliceViews::NONE;
    let set = |i: usize| ids.ptr() + ((i % 8) * 8 * 4) as u64;
    let swiglu = |i: usize| {
        gpu.moe_gemv_swiglu(
            8,
            gu_ptrs.ptr(),
            0,
            e,
            set(i),
            x.ptr(),
            8,
            8,
            h,
            f,
            views,
            act.ptr(),
        )
    };
    // ids_final as the executor launches it (sound here too: each launch's predecessor, a
    // combine or a SwiGLU kernel, waited for the uploads)
    let combine = |i: usize| {
        let ex = (0, e, set(i), act.ptr(), wts.ptr());
        gpu.moe_gemv_combine_after(1, 8, dn_ptrs.ptr(), ex, f, h, views, xo.ptr(), true)
    };
    // moe_gemv_swiglu taken apart (lab_swiglu_m*): its loads alone, with its arithmetic,
    // with its lookup of the matrix after the wait; then the kernel itself.
    for (name, label) in [
        ("lab_swiglu_m0", "lab_swiglu_m0 (its loads only)"),
        (
            "lab_swiglu_m1",
            "lab_swiglu_m1 (+ dots, sums, SwiGLU, store)",
        ),
        ("lab_swiglu_m2", "lab_swiglu_m2 (+ ids[p] -> pointer table)"),
    ] {
        let run = |i: usize| {
            let s = i % 8;
            let args = mlaserve_cuda::args![
                gu_base + (s * 8 * gu_bytes) as u64,
                gu_ptrs.ptr(),
                ids_seq.ptr() + (s * 8 * 4) as u64,
                x.ptr(),
                h as i32,
                f as i32,
                act.ptr(),
                sink.ptr()
            ];
            gpu.launch(name, Gpu::cfg((f.div_ceil(8) as u32, 8, 1), 256), &args)
        };
        let us = common::time_us(&gpu, &run, 3, 15, 20)?;
        row(label, 8 * gu_bytes, us);
    }
    let us = common::time_us(&gpu, &swiglu, 3, 15, 20)?;
    row(
        "moe_gemv_swiglu (8 pairs, gate|up 2816 x 2048)",
        8 * gu_bytes,
        us,
    );
    let us = common::time_us(&gpu, &combine, 3, 15, 20)?;
    row(
        "moe_gemv_combine (8 pairs, down 2048 x 1408)",
        8 * dn_bytes,
        us,
    );
    let pair = |i: usize| {
        swiglu(i)?;
        combine(i)
    };
    let us = common::time_us(&gpu, &pair, 3, 15, 20)?;
    row(
        "swiglu then combine (the step's pair)",
        8 * (gu_bytes + dn_bytes),
        us,
    );
    // 5. The dense bf16 GEMV at one row (`gemv_bf16_m1`) on the step's largest reads: lm_head
    //    [102400, 2048] (419 MB, one launch a step) and layer 0's MLP (gate|up [21888, 2048],
    //    down [2048, 10944]).
    let y = gpu.alloc::<f32>(102_400)?;
    let xk = gpu.upload(&common::random_bf16(10_944, 9))?;
    for (label, rows, k) in [
        (
            "gemv_bf16_m1 lm_head [102400, 2048]",
            102_400usize,
            2048usize,
        ),
        ("gemv_bf16_m1 layer 0 gate|up [21888, 2048]", 21_888, 2048),
        ("gemv_bf16_m1 layer 0 down [2048, 10944]", 2048, 10_944),
    ] {
        let bytes = rows * k * 2;
        let slots = pool_bytes / bytes;
        let run = |i: usize| {
            let mat = GemvMat {
                w: pool.ptr() + ((i % slots) * bytes) as u64,
                rows,
                out: y.ptr(),
                ld: rows,
            };
            gpu.gemv_bf16(1, k, GemvX::Bf16(xk.ptr()), &[mat], false)
        };
        let us = common::time_us(&gpu, &run, 3, 15, if bytes > 200_000_000 { 5 } else { 20 })?;
        row(label, bytes, us);
    }
    let s = gpu.to_host(&sink)?;
    let o = gpu.to_host(&xo)?;
    println!(
        "sink {:#x} (0 expected), combine output finite: {}",
        s[0],
        o.iter().all(|v| v.is_finite())
    );
    Ok(())
}
