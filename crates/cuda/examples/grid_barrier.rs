//! Kernel lab: the cost of one dependent hand-off between all blocks of the GPU, as a kernel
//! boundary and as a grid barrier inside one kernel (`kernels/lab.cu`). It decides whether a
//! persistent kernel with barriers between its phases can beat a chain of launches.
//!
//! 1. A CUDA graph of K `lab_handoff` launches (one block an SM; each block reads a word its
//!    neighbour wrote in the launch before), with programmatic dependent launch as the engine
//!    launches every kernel, and without it; µs per boundary = (T(64) - T(8)) / 56.
//! 2. `lab_grid_sync` with R rounds of write, barrier, read the neighbour's word, one block
//!    an SM; µs per barrier = (T(64) - T(0)) / 64.
//!
//! Both check every hand-off (a stale word or a barrier timeout is counted and reported).
//! Timing: CUDA events around batches of back-to-back calls, median of 15 (common::time_us).
//!
//! ```text
//! cargo run --release -p mlaserve-cuda --example grid_barrier
//! ```

#[path = "common/mod.rs"]
mod common;

use cudarc::driver::CudaGraph;
use mlaserve_cuda::error::CudaError;
use mlaserve_cuda::gpu::Arg;
use mlaserve_cuda::{DBuf, Gpu};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A graph: zero buffer 0, then `k` hand-off launches over `nb` blocks (checked in `err`).
fn chain(gpu: &Gpu, k: usize, nb: u32, a: &DBuf<u32>, b: u64, err: u64) -> Res<CudaGraph> {
    gpu.begin_capture()?;
    let bufs = [a.ptr(), b];
    let body = || -> mlaserve_cuda::error::Result<()> {
        gpu.zero(a)?; // buffer 0 starts at zero each replay
        for i in 0..k {
            let (prev, next) = (bufs[i % 2], bufs[(i + 1) % 2]);
            let args = [Arg::P(prev), Arg::P(next), Arg::I(i as i32), Arg::P(err)];
            gpu.launch("lab_handoff", Gpu::cfg((nb, 1, 1), 256), &args)?;
        }
        Ok(())
    };
    let r = body();
    let g = gpu.end_capture();
    r?;
    Ok(g?)
}

fn main() -> Res<()> {
    let mut gpu = Gpu::new(0)?;
    let nb = gpu.sm_count as u32;
    let a = gpu.alloc::<u32>(2 * nb as usize)?;
    let b = gpu.alloc::<u32>(nb as usize)?;
    let err = gpu.alloc::<u32>(2)?;
    let bar = gpu.alloc::<u32>(2)?;
    gpu.zero(&err)?;
    gpu.zero(&bar)?;
    println!("{} SMs, one block of 256 threads each", nb);
    for pdl in [true, false] {
        gpu.pdl = pdl;
        let mut t = Vec::new();
        for k in [8usize, 64] {
            let g = chain(&gpu, k, nb, &a, b.ptr(), err.ptr())?;
            let run = |_| g.launch().map_err(|e| CudaError::driver("a lab graph", e));
            t.push(common::time_us(&gpu, &run, 3, 15, 20)?);
        }
        println!(
            "kernel boundary (graph{}): {:.2} µs per hand-off (8 launches {:.1} µs, 64 launches {:.1} µs)",
            if pdl { ", PDL" } else { "" },
            (t[1] - t[0]) / 56.0,
            t[0],
            t[1]
        );
    }
    gpu.pdl = true;
    let mut t = Vec::new();
    for rounds in [0i32, 64] {
        let run = |i: usize| {
            let args = [
                Arg::P(bar.ptr()),
                Arg::P(a.ptr()),
                Arg::I(rounds),
                Arg::I((i as i32) << 8),
                Arg::P(err.ptr()),
            ];
            gpu.launch("lab_grid_sync", Gpu::cfg((nb, 1, 1), 256), &args)
        };
        t.push(common::time_us(&gpu, &run, 3, 15, 20)?);
    }
    println!(
        "grid barrier: {:.2} µs per hand-off (0 rounds {:.1} µs, 64 rounds {:.1} µs)",
        (t[1] - t[0]) / 64.0,
        t[0],
        t[1]
    );
    let e = gpu.to_host(&err)?;
    println!("stale words read: {}, barrier timeouts: {}", e[0], e[1]);
    if e != [0, 0] {
        return Err("a hand-off read a stale word or a barrier timed out".into());
    }
    Ok(())
}
