//! Shared by the kernel labs (`#[path = "common/mod.rs"] mod common;`): random inputs and
//! event timing.
#![allow(dead_code)] // each lab uses a subset

use cudarc::driver::sys::CUevent_flags;
use mlaserve_cuda::Gpu;
use rayon::prelude::*;

/// `n` xorshift bytes from `seed` (chunks seeded apart, filled in parallel).
pub fn xorshift_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; n];
    out.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut s = seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for b in chunk.chunks_mut(8) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let v = s.to_le_bytes();
                b.copy_from_slice(&v[..b.len()]);
            }
        });
    out
}

/// Random bf16 bit patterns of uniform [-1, 1) values, `n` of them, from `seed`.
pub fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    xorshift_bytes(2 * n, seed)
        .chunks_exact(2)
        .map(|c| {
            let f = u16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0 - 1.0;
            half::bf16::from_f32(f).to_bits()
        })
        .collect()
}

/// [`random_bf16`] as f32 (every value exactly representable in bf16).
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    random_bf16(n, seed)
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect()
}

/// µs per call of `run` (passed the call's index, e.g. to rotate weight copies): `warmups`
/// calls, then `batches` batches of `per` back-to-back calls between two CUDA events (the
/// host enqueues ahead, so launch latency stays out); median.
pub fn time_us(
    gpu: &Gpu,
    run: &dyn Fn(usize) -> mlaserve_cuda::error::Result<()>,
    warmups: usize,
    batches: usize,
    per: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    for i in 0..warmups {
        run(i)?;
    }
    gpu.sync()?;
    let mut times = Vec::new();
    let mut i = warmups;
    for _ in 0..batches {
        let e0 = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let e1 = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e0.record(&gpu.stream)?;
        for _ in 0..per {
            run(i)?;
            i += 1;
        }
        e1.record(&gpu.stream)?;
        e1.synchronize()?;
        times.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / per as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}
