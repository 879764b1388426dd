//! Shared by the kernel labs (`#[path = "common/mod.rs"] mod common;`): event timing.

use cudarc::driver::sys::CUevent_flags;
use mlaserve_cuda::Gpu;

/// µs per call of `run`: `warmups` calls, then `batches` batches of `per` back-to-back calls
/// between two CUDA events (the host enqueues ahead, so launch latency stays out); median.
pub fn time_us(
    gpu: &Gpu,
    run: &dyn Fn() -> mlaserve_cuda::error::Result<()>,
    warmups: usize,
    batches: usize,
    per: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    for _ in 0..warmups {
        run()?;
    }
    gpu.sync()?;
    let mut times = Vec::new();
    for _ in 0..batches {
        let e0 = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let e1 = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e0.record(&gpu.stream)?;
        for _ in 0..per {
            run()?;
        }
        e1.record(&gpu.stream)?;
        e1.synchronize()?;
        times.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / per as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}
