//! Kernel lab: the absorbed MLA decode kernel (`attn_mqa_split` + combine) at serving
//! shapes, timed with CUDA events (median of 20 after 3 warm-ups), reported as effective
//! bandwidth (cache bytes + q + out over time) and TFLOP/s, against the machine's measured
//! ceilings (3,970 GB/s copy, 804 TFLOP/s bf16 GEMM; ../shared/design/gpu.md).
//! Correctness of the same kernel is the op table's job (tests/ops.rs).
//!
//!     cargo run --release -p mlaserve-cuda --example mla_decode [-- --json out.json]

use mlaserve_cuda::ops::{AttnDims, KeyLists};
use mlaserve_cuda::Gpu;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = Gpu::new(0)?;
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    let (l, r, p, bs) = (512usize, 64usize, 128usize, 64usize);
    let mut rows = Vec::new();
    println!("| B | heads | ctx | splits | µs (median) | GB/s | TFLOP/s |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &(b, heads, ctx) in &[(64usize, 16usize, 4096usize), (128, 16, 8192), (64, 128, 4096), (128, 128, 4096)] {
        let blocks_per = ctx.div_ceil(bs);
        let nb = b * blocks_per;
        let cache = gpu.alloc_filled::<u16>(nb * bs * (l + r), 0x3c)?; // bf16 0x3c3c ~ 0.0115
        let tables: Vec<i32> = (0..nb as i32).collect();
        let bt = gpu.upload(&tables)?;
        let bt_off = gpu.upload(&(0..b).map(|i| (i * blocks_per) as i32).collect::<Vec<_>>())?;
        let n_keys = gpu.upload(&vec![ctx as i32; b])?;
        let sel_off = gpu.upload(&vec![-1i32; b])?;
        let sel_pos = gpu.upload(&[0i32])?;
        let q_lat = gpu.alloc_filled::<f32>(b * heads * l, 0x3c)?;
        let q = gpu.alloc_filled::<f32>(b * heads * (p + r), 0x3c)?;
        let o_lat = gpu.alloc::<u16>(b * heads * l)?;
        for splits in [1usize, 4, 16] {
            let part = gpu.alloc::<f32>(b * heads * splits * l)?;
            let lse = gpu.alloc::<f32>(b * heads * splits)?;
            let dims = AttnDims { t: b, heads, p, r, v: 0, l, scale: 0.07 };
            let keys = KeyLists { n_keys: n_keys.ptr(), sel_off: sel_off.ptr(), sel_pos: sel_pos.ptr() };
            let run = || gpu.attn_mqa(&dims, q_lat.ptr(), q.ptr(), cache.ptr(), &keys, bt.ptr(), bt_off.ptr(), bs, splits, part.ptr(), lse.ptr(), o_lat.ptr());
            for _ in 0..3 {
                run()?;
            }
            gpu.sync()?;
            let mut times = Vec::new();
            for _ in 0..20 {
                let e0 = gpu.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
                let e1 = gpu.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
                e0.record(&gpu.stream)?;
                run()?;
                e1.record(&gpu.stream)?;
                e1.synchronize()?;
                times.push(e0.elapsed_ms(&e1)? as f64 * 1e3);
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let us = times[times.len() / 2];
            let bytes = (b * ctx * (l + r) * 2 + b * heads * (l + r) * 4 + b * heads * l * 2) as f64;
            let flops = (2 * b * heads * ctx * (l + r) + 2 * b * heads * ctx * l) as f64;
            let gbs = bytes / us / 1e3;
            let tfs = flops / us / 1e6;
            println!("| {b} | {heads} | {ctx} | {splits} | {us:.1} | {gbs:.0} | {tfs:.1} |");
            rows.push(serde_json::json!({"batch": b, "heads": heads, "ctx": ctx, "splits": splits, "us_median": us, "gb_s": gbs, "tflop_s": tfs}));
        }
    }
    if let Some(p) = json {
        let doc = serde_json::json!({"gpu": gpu.name, "kernel": "attn_mqa_split+combine (naive: a block per (token, head, split))", "rows": rows});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
