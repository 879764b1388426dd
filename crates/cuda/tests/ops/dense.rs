//! Dense ops: GEMMs (cuBLAS and the warp GEMV), element-wise kernels, norms, RoPE, caches.

use super::*;

pub(super) fn gemms(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    for &(m, n, k) in &[
        (1, 256, 128),
        (7, 576, 512),
        (64, 1024, 256),
        (300, 384, 1024),
    ] {
        let x = round_bf(&rng.vec(m * k, 1.0));
        let w = round_bf(&rng.vec(n * k, 0.1));
        let xd = gpu
            .upload(&x.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let wd = gpu
            .upload(&w.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let out = poisoned::<f32>(gpu, m * n);
        gpu.gemm(&Gemm::plain(
            GemmType::Bf16,
            m,
            n,
            k,
            xd.ptr(),
            wd.ptr(),
            out.ptr(),
        ))
        .unwrap();
        let got = gpu.to_host(&out).unwrap();
        rep.check(
            "gemm",
            format!("m{m} n{n} k{k}"),
            "bf16>f32",
            rel_err(&got, &gemm_ref(&x, &w, m, n, k)),
            1e-4,
        );
        // beta = 1 accumulates onto existing output.
        let base = rng.vec(m * n, 1.0);
        let acc = gpu.upload(&base).unwrap();
        gpu.gemm(&Gemm::plain(GemmType::Bf16, m, n, k, xd.ptr(), wd.ptr(), acc.ptr()).accumulate())
            .unwrap();
        let got = gpu.to_host(&acc).unwrap();
        let want: Vec<f32> = gemm_ref(&x, &w, m, n, k)
            .iter()
            .zip(&base)
            .map(|(a, b)| a + b)
            .collect();
        rep.check(
            "gemm+acc",
            format!("m{m} n{n} k{k}"),
            "bf16>f32",
            rel_err(&got, &want),
            1e-4,
        );
    }
    gemv(gpu, rng, rep);
    // f32 router GEMM.
    let (m, n, k) = (5, 64, 256);
    let x = rng.vec(m * k, 1.0);
    let w = rng.vec(n * k, 0.1);
    let (xd, wd) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
    let out = poisoned::<f32>(gpu, m * n);
    gpu.gemm(&Gemm::plain(
        GemmType::F32,
        m,
        n,
        k,
        xd.ptr(),
        wd.ptr(),
        out.ptr(),
    ))
    .unwrap();
    rep.check(
        "gemm",
        format!("m{m} n{n} k{k}"),
        "f32",
        rel_err(&gpu.to_host(&out).unwrap(), &gemm_ref(&x, &w, m, n, k)),
        1e-5,
    );
    // Strided batched over heads, non-contiguous x (the absorbed q_lat = W_UK_h · q_nope_h).
    for &(t, heads, p, r, l) in &[(5, 16, 128, 64, 512), (3, 4, 192, 64, 512)] {
        let qk = p + r;
        let q = round_bf(&rng.vec(t * heads * qk, 1.0));
        let wk = round_bf(&rng.vec(heads * l * p, 0.1));
        let qd = gpu
            .upload(&q.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let wdv = gpu
            .upload(&wk.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let out = poisoned::<f32>(gpu, t * heads * l);
        gpu.gemm(&Gemm {
            m: t,
            n: l,
            k: p,
            ty: GemmType::Bf16,
            x: qd.ptr(),
            ldx: heads * qk,
            stride_x: qk,
            w: wdv.ptr(),
            ldw: p,
            stride_w: l * p,
            out: out.ptr(),
            ldo: heads * l,
            stride_o: l,
            batch: heads,
            beta: 0.0,
        })
        .unwrap();
        let got = gpu.to_host(&out).unwrap();
        let mut want = vec![0f32; t * heads * l];
        for h in 0..heads {
            let xh: Vec<f32> = (0..t)
                .flat_map(|i| q[i * heads * qk + h * qk..][..p].to_vec())
                .collect();
            let r = gemm_ref(&xh, &wk[h * l * p..(h + 1) * l * p], t, l, p);
            for i in 0..t {
                want[i * heads * l + h * l..][..l].copy_from_slice(&r[i * l..(i + 1) * l]);
            }
        }
        rep.check(
            "gemm_batched",
            format!("T{t} N{heads} P{p} L{l} ldx{}", heads * qk),
            "bf16>f32",
            rel_err(&got, &want),
            1e-4,
        );
        // The same product written as bf16 (the decode path's W_UV into o_proj's input):
        // the f64 reference rounded once to bf16, within one bf16 step of the largest value.
        let outb = poisoned::<u16>(gpu, t * heads * l);
        gpu.gemm(&Gemm {
            m: t,
            n: l,
            k: p,
            ty: GemmType::Bf16Out,
            x: qd.ptr(),
            ldx: heads * qk,
            stride_x: qk,
            w: wdv.ptr(),
            ldw: p,
            stride_w: l * p,
            out: outb.ptr(),
            ldo: heads * l,
            stride_o: l,
            batch: heads,
            beta: 0.0,
        })
        .unwrap();
        let got: Vec<f32> = gpu.to_host(&outb).unwrap().into_iter().map(unbf).collect();
        rep.check(
            "gemm_batched",
            format!("T{t} N{heads} P{p} L{l} ldx{} bf16 out", heads * qk),
            "bf16>bf16",
            rel_err(&got, &round_bf(&want)),
            8e-3,
        );
    }
}

/// The decode GEMV (gemv.rs): 1-4 rows, one or two matrices (row counts that split a block
/// and end on an odd row), plain and accumulating, x bf16 or normalized in the prologue — its
/// bf16 rows bit for bit rms_norm's, its products against f64 over those rows. K covers the
/// steps loaded before the wait (8 at one row, 4 at more), partial ones, and the loop past them.
pub(super) fn gemv(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_cuda::gemv::{GemvMat, GemvX};
    for &(m, k, r0, r1) in &[
        (1usize, 2048usize, 40usize, 23usize),
        (2, 264, 16, 0),
        (3, 512, 7, 90),
        (4, 2048, 576, 0),
        (1, 264, 33, 5),
        (1, 4104, 20, 3),
        (2, 1288, 9, 0),
        // An lm_head's grid (65,536+ rows: the executor's GEMV at one row), short K.
        (1, 264, 100_003, 0),
    ] {
        let w0 = round_bf(&rng.vec(r0 * k, 0.1));
        let w1 = round_bf(&rng.vec(r1 * k, 0.1));
        let up = |v: &[f32]| {
            gpu.upload(&v.iter().map(|&x| bf(x)).collect::<Vec<_>>())
                .unwrap()
        };
        let (w0d, w1d) = (up(&w0), up(&w1));
        let xf = rng.vec(m * k, 2.0);
        let gamma = rng.vec(k, 1.0);
        let (xfd, gd) = (gpu.upload(&xf).unwrap(), gpu.upload(&gamma).unwrap());
        // The norm kernel's rows, the reference input.
        let hnb_ref = poisoned::<u16>(gpu, m * k);
        gpu.rms_norm(
            m,
            xfd.ptr(),
            k,
            0,
            gd.ptr(),
            0,
            0,
            hnb_ref.ptr(),
            k,
            k,
            1e-6,
        )
        .unwrap();
        let xb: Vec<f32> = gpu
            .to_host(&hnb_ref)
            .unwrap()
            .into_iter()
            .map(unbf)
            .collect();
        let (want0, want1) = (gemm_ref(&xb, &w0, m, r0, k), gemm_ref(&xb, &w1, m, r1, k));
        for (norm, acc) in [(false, false), (true, false), (false, true), (true, true)] {
            let base0 = rng.vec(m * r0, 1.0);
            let base1 = rng.vec(m * (r1 + 3), 1.0);
            let (o0, o1) = (gpu.upload(&base0).unwrap(), gpu.upload(&base1).unwrap());
            let hnb = poisoned::<u16>(gpu, m * k);
            let x = if norm {
                GemvX::Norm {
                    x: xfd.ptr(),
                    gamma: gd.ptr(),
                    eps: 1e-6,
                    hnb: hnb.ptr(),
                }
            } else {
                GemvX::Bf16(hnb_ref.ptr())
            };
            let mut mats = vec![GemvMat {
                w: w0d.ptr(),
                rows: r0,
                out: o0.ptr(),
                ld: r0,
            }];
            if r1 > 0 {
                // The second output has a wider row stride (like kv inside [T, L+R] rows).
                mats.push(GemvMat {
                    w: w1d.ptr(),
                    rows: r1,
                    out: o1.ptr(),
                    ld: r1 + 3,
                });
            }
            gpu.gemv_bf16(m, k, x, &mats, acc).unwrap();
            let got0 = gpu.to_host(&o0).unwrap();
            let got1 = gpu.to_host(&o1).unwrap();
            let mut w0x = want0.clone();
            let mut w1x = base1.clone();
            for i in 0..m {
                for r in 0..r0 {
                    w0x[i * r0 + r] += if acc { base0[i * r0 + r] } else { 0.0 };
                }
                for r in 0..r1 {
                    let o = &mut w1x[i * (r1 + 3) + r];
                    *o = want1[i * r1 + r] + if acc { *o } else { 0.0 };
                }
            }
            let err = rel_err(&got0, &w0x).max(if r1 > 0 { rel_err(&got1, &w1x) } else { 0.0 });
            let name = format!(
                "M{m} K{k} rows {r0}+{r1}{}{}",
                if norm { " norm" } else { "" },
                if acc { " acc" } else { "" }
            );
            rep.check("gemv_bf16", name.clone(), "bf16>f32", err, 1e-5);
            if norm {
                let (a, b) = (gpu.to_host(&hnb).unwrap(), gpu.to_host(&hnb_ref).unwrap());
                let mism = a.iter().zip(&b).filter(|(a, b)| a != b).count();
                rep.check("gemv_bf16 hnb", name, "bf16", mism as f64, 0.0);
            }
        }
    }
}

pub(super) fn elementwise(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    // embedding
    let (vocab, h, t) = (300, 256, 9);
    let table: Vec<u16> = rng.vec(vocab * h, 1.0).iter().map(|&v| bf(v)).collect();
    let toks: Vec<u32> = (0..t).map(|_| rng.below(vocab) as u32).collect();
    let (td, kd) = (gpu.upload(&table).unwrap(), gpu.upload(&toks).unwrap());
    let x = poisoned::<f32>(gpu, t * h);
    gpu.embed(&td, &kd, x.ptr(), h).unwrap();
    let want: Vec<f32> = toks
        .iter()
        .flat_map(|&k| table[k as usize * h..][..h].iter().map(|&b| unbf(b)))
        .collect();
    rep.check(
        "embed",
        format!("V{vocab} H{h} T{t}"),
        "bf16>f32",
        rel_err(&gpu.to_host(&x).unwrap(), &want),
        0.0,
    );
    // f32 -> bf16, with specials
    let mut v = rng.vec(10_000, 100.0);
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        -3e-39,
        65504.0,
        3.4e38,
    ]);
    let vd = gpu.upload(&v).unwrap();
    let out = poisoned::<u16>(gpu, v.len());
    gpu.to_bf16(vd.ptr(), out.ptr(), v.len()).unwrap();
    let got = gpu.to_host(&out).unwrap();
    let mism = got.iter().zip(&v).filter(|(&g, &x)| g != bf(x)).count();
    rep.check(
        "f32_to_bf16",
        format!("n{}", v.len()),
        "f32>bf16",
        mism as f64,
        0.0,
    );
    // RMSNorm, f32 and bf16 outputs, strided input rows, a row index
    for &(rows, n) in &[(1, 128), (7, 512), (33, 7168)] {
        let xs = n + 64;
        let xin = rng.vec(rows * xs, 2.0);
        let w = rng.vec(n, 1.0);
        let idx: Vec<i32> = (0..rows as i32).rev().collect();
        let (xd, wd, id) = (
            gpu.upload(&xin).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.upload(&idx).unwrap(),
        );
        let out = poisoned::<f32>(gpu, rows * n);
        let outb = poisoned::<u16>(gpu, rows * n);
        gpu.rms_norm(
            rows,
            xd.ptr(),
            xs,
            id.ptr(),
            wd.ptr(),
            out.ptr(),
            n,
            outb.ptr(),
            n,
            n,
            1e-6,
        )
        .unwrap();
        let mut want = Vec::new();
        for &r in &idx {
            let mut row = xin[r as usize * xs..][..n].to_vec();
            rms_norm(&mut row, n, &w, 1e-6);
            want.extend(row);
        }
        rep.check(
            "rms_norm",
            format!("rows{rows} n{n} stride{xs}"),
            "f32",
            rel_err(&gpu.to_host(&out).unwrap(), &want),
            1e-5,
        );
        let gb: Vec<f32> = gpu
            .to_host(&outb)
            .unwrap()
            .iter()
            .map(|&b| unbf(b))
            .collect();
        rep.check(
            "rms_norm",
            format!("rows{rows} n{n}"),
            "f32>bf16",
            rel_err(&gb, &want),
            1.0 / 256.0,
        );
    }
    // LayerNorm in place
    let (rows, n) = (6, 128);
    let xin = rng.vec(rows * n, 3.0);
    let (w, b) = (rng.vec(n, 1.0), rng.vec(n, 0.5));
    let (xd, wd, bd) = (
        gpu.upload(&xin).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&b).unwrap(),
    );
    gpu.layer_norm(rows, xd.ptr(), n, wd.ptr(), bd.ptr(), n, 1e-6)
        .unwrap();
    let mut want = xin.clone();
    for row in want.chunks_mut(n) {
        let mean = row.iter().sum::<f32>() / n as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        let inv = 1.0 / (var + 1e-6).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            *v = (*v - mean) * inv * w[i] + b[i];
        }
    }
    rep.check(
        "layer_norm",
        format!("rows{rows} n{n}"),
        "f32",
        rel_err(&gpu.to_host(&xd).unwrap(), &want),
        1e-5,
    );
    // RoPE with YaRN on q_pe of every head (offset inside the head) and on k_pe
    let yarn = Yarn {
        factor: 40.0,
        original_context_length: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        log_multiplier: 0.1,
        attn_factor: 1.0,
    };
    for (heads, p, r) in [(16usize, 128usize, 64usize), (4, 32, 16)] {
        let t = 11;
        let rope = Rope::new(r, 10000.0, Some(&yarn));
        let pos: Vec<usize> = (0..t).map(|i| i * 977 % 5000).collect();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for &ps in &pos {
            let (c, s) = rope.cos_sin(ps);
            cos.extend(c);
            sin.extend(s);
        }
        let qk = p + r;
        let q = rng.vec(t * heads * qk, 1.0);
        let (qd, cd, sd) = (
            gpu.upload(&q).unwrap(),
            gpu.upload(&cos).unwrap(),
            gpu.upload(&sin).unwrap(),
        );
        gpu.rope(t, qd.ptr(), heads * qk, heads, qk, p, r, cd.ptr(), sd.ptr())
            .unwrap();
        let mut want = q.clone();
        for i in 0..t {
            for hd in 0..heads {
                let o = i * heads * qk + hd * qk + p;
                Rope::apply(
                    &mut want[o..o + r],
                    &cos[i * r / 2..(i + 1) * r / 2],
                    &sin[i * r / 2..(i + 1) * r / 2],
                );
            }
        }
        rep.check(
            "rope_yarn",
            format!("T{t} N{heads} P{p} R{r}"),
            "f32",
            rel_err(&gpu.to_host(&qd).unwrap(), &want),
            1e-5,
        );
        // The decode path's fused kernel against rope (above) then the bf16 cast: the same
        // f32 rows and bf16 copy, bit for bit.
        let (qa, qb) = (
            gpu.upload(&q).unwrap(),
            poisoned::<u16>(gpu, t * heads * qk),
        );
        let (cp, sp) = (cd.ptr(), sd.ptr());
        gpu.q_finish(t, qa.ptr(), heads * qk, heads, qk, p, r, cp, sp, qb.ptr())
            .unwrap();
        let qref = poisoned::<u16>(gpu, t * heads * qk);
        gpu.to_bf16(qd.ptr(), qref.ptr(), t * heads * qk).unwrap();
        let (fa, fb) = (gpu.to_host(&qa).unwrap(), gpu.to_host(&qd).unwrap());
        let (ba, bb) = (gpu.to_host(&qb).unwrap(), gpu.to_host(&qref).unwrap());
        let mism = fa
            .iter()
            .zip(&fb)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count()
            + ba.iter().zip(&bb).filter(|(a, b)| a != b).count();
        rep.check(
            "q_finish",
            format!("T{t} N{heads} P{p} R{r} vs rope+to_bf16"),
            "f32>bf16",
            mism as f64,
            0.0,
        );
    }
    // SwiGLU to bf16
    let (rows, f) = (13, 1408);
    let gu = rng.vec(rows * 2 * f, 3.0);
    let gd = gpu.upload(&gu).unwrap();
    let out = poisoned::<u16>(gpu, rows * f);
    gpu.silu_mul(gd.ptr(), out.ptr(), f, rows).unwrap();
    let mut want = Vec::new();
    for row in gu.chunks(2 * f) {
        let mut g = row[..f].to_vec();
        silu_mul(&mut g, &row[f..]);
        want.extend(g);
    }
    let got: Vec<f32> = gpu
        .to_host(&out)
        .unwrap()
        .iter()
        .map(|&b| unbf(b))
        .collect();
    rep.check(
        "silu_mul",
        format!("rows{rows} F{f}"),
        "f32>bf16",
        rel_err(&got, &want),
        1.0 / 256.0,
    );
    // gather rows + MoE combine
    let (t, k, h) = (6, 3, 96);
    let src: Vec<u16> = rng.vec(t * h, 1.0).iter().map(|&v| bf(v)).collect();
    let idx: Vec<i32> = (0..t * k).map(|i| (i % t) as i32).collect();
    let (sd, id) = (gpu.upload(&src).unwrap(), gpu.upload(&idx).unwrap());
    let dst = poisoned::<u16>(gpu, t * k * h);
    gpu.gather_rows(sd.ptr(), id.ptr(), t * k, dst.ptr(), h)
        .unwrap();
    let want: Vec<u16> = idx
        .iter()
        .flat_map(|&i| src[i as usize * h..][..h].to_vec())
        .collect();
    let mism = gpu
        .to_host(&dst)
        .unwrap()
        .iter()
        .zip(&want)
        .filter(|(a, b)| a != b)
        .count();
    rep.check(
        "gather_rows",
        format!("M{} H{h}", t * k),
        "bf16",
        mism as f64,
        0.0,
    );
    let y = rng.vec(t * k * h, 1.0);
    let mut rows_of: Vec<i32> = (0..(t * k) as i32).rev().collect();
    rows_of[4] = -1;
    let wts = rng.vec(t * k, 1.0);
    let x0 = rng.vec(t * h, 1.0);
    let (xd, yd, rd, wd) = (
        gpu.upload(&x0).unwrap(),
        gpu.upload(&y).unwrap(),
        gpu.upload(&rows_of).unwrap(),
        gpu.upload(&wts).unwrap(),
    );
    gpu.moe_combine(t, xd.ptr(), yd.ptr(), rd.ptr(), wd.ptr(), k, h)
        .unwrap();
    let mut want = x0.clone();
    for ti in 0..t {
        for j in 0..k {
            let r = rows_of[ti * k + j];
            if r >= 0 {
                for i in 0..h {
                    want[ti * h + i] += wts[ti * k + j] * y[r as usize * h + i];
                }
            }
        }
    }
    rep.check(
        "moe_combine",
        format!("T{t} K{k} H{h}"),
        "f32",
        rel_err(&gpu.to_host(&xd).unwrap(), &want),
        1e-6,
    );
}
