//! MoE: routing, the expert GEMVs over (token, slot) pairs and their combine, grouped GEMMs.

use super::*;

/// The routing part of a MoE config for the routing tests (one shared expert, intermediate 8,
/// routed scaling 2.5).
fn route_cfg_moe(
    e: usize,
    k: usize,
    gating: mlaserve_model::Gating,
    n_group: usize,
    topk_group: usize,
    norm: bool,
    bias: bool,
) -> mlaserve_model::MoeConfig {
    mlaserve_model::MoeConfig {
        num_experts: e,
        top_k: k,
        num_shared_experts: 1,
        moe_intermediate_size: 8,
        n_group,
        topk_group,
        routed_scaling_factor: 2.5,
        norm_topk_prob: norm,
        gating,
        has_correction_bias: bias,
    }
}

/// `moe_norm_route` (FFN norm + router + routing in one launch, a ticket per token): hnb bit
/// for bit `rms_norm`'s bf16 rows; logits against f64 of rms_norm's f32 rows times the router;
/// ids exactly and weights (1e-5) against the CPU's `route` on the kernel's own logits; run
/// twice (the tickets must be back at zero for the second launch to route at all). H 512 takes
/// the kernel's one-pass path (H <= 8 x 256), H 2,312 its loop (a partial last step); one
/// router has its rows in equal pairs, so every choice is a tie.
fn moe_norm_route(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_cuda::ops::RouteCfg;
    use mlaserve_model::layers::ffn::route;
    use mlaserve_model::Gating;
    for (i, &(e, k, gating, n_group, topk_group, norm, bias, ns, t)) in [
        (
            64usize,
            6usize,
            Gating::Softmax,
            1usize,
            1usize,
            false,
            false,
            2usize,
            1usize,
        ),
        (160, 6, Gating::Softmax, 8, 3, false, false, 1, 3),
        (256, 8, Gating::Sigmoid, 8, 4, true, true, 0, 4),
        // Fewer experts than a warp's lanes, in groups (the CPU routing's small case).
        (8, 2, Gating::Sigmoid, 4, 1, true, true, 1, 2),
        // DeepSeek-V2-Lite's router (64 x 2,048): the cluster kernel's one-logit-a-warp path.
        (64, 6, Gating::Softmax, 1, 1, false, false, 2, 2),
        // Sigmoid scores with a bias and no groups over 128 and 192 experts: the cluster
        // kernel's routing by rank (route_row_rank) with two threads an expert, and one.
        (128, 8, Gating::Sigmoid, 1, 1, true, true, 1, 2),
        (192, 8, Gating::Sigmoid, 1, 1, true, true, 0, 1),
        // Router rows in equal pairs: every logit has a twin, so the choice breaks ties (to the
        // lower index, as the CPU's `route` does); an odd k puts a tie on the last pick.
        (64, 5, Gating::Softmax, 1, 1, true, false, 2, 2),
    ]
    .iter()
    .enumerate()
    {
        let h = match i {
            2 => 2312usize,
            4 => 2048,
            _ => 512,
        };
        let mc = route_cfg_moe(e, k, gating, n_group, topk_group, norm, bias);
        let rc = RouteCfg {
            experts: e,
            top_k: k,
            gating: if gating == Gating::Softmax { 0 } else { 1 },
            n_group,
            topk_group,
            norm,
            scale: 2.5,
            shared: ns,
        };
        let x = rng.vec(t * h, 2.0);
        let gamma = rng.vec(h, 1.0);
        let mut router = rng.vec(e * h, 0.2);
        if i == 7 {
            for r in (1..e).step_by(2) {
                router.copy_within((r - 1) * h..r * h, r * h);
            }
        }
        let b = rng.vec(e, 0.5);
        let (xd, gd, rd, bd) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&gamma).unwrap(),
            gpu.upload(&router).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        let tickets = gpu.upload(&vec![0u32; t]).unwrap();
        let ko = k + ns;
        let name = format!("T{t} E{e} K{k}+{ns} {gating:?} groups {n_group}/{topk_group} H{h}");
        // The unfused reference rows.
        let (hn, hnb_ref) = (poisoned::<f32>(gpu, t * h), poisoned::<u16>(gpu, t * h));
        gpu.rms_norm(
            t,
            xd.ptr(),
            h,
            0,
            gd.ptr(),
            hn.ptr(),
            h,
            hnb_ref.ptr(),
            h,
            h,
            1e-6,
        )
        .unwrap();
        let hn = gpu.to_host(&hn).unwrap();
        let hnb_ref = gpu.to_host(&hnb_ref).unwrap();
        // The ticket kernel, then the cluster kernel where it takes the shape (every shape
        // here on sm_90), each twice (the tickets reset, the kernel runs again; the second
        // time with `fence_hnb`, the same outputs).
        let kernels = [None, Some(8u32)];
        let cluster_fits = gpu.route_cluster_fits(&rc, h, 8);
        if gpu.has_clusters() {
            // On sm_90 every shape here runs the cluster kernel: its coverage is not optional.
            let miss = if cluster_fits { 0.0 } else { 1.0 };
            rep.check("moe_norm_route cluster", name.clone(), "-", miss, 0.0);
        }
        let runs = kernels
            .iter()
            .filter(|c| c.is_none() || cluster_fits)
            .flat_map(|&c| [(c, 0), (c, 1)]);
        for (cluster, run) in runs {
            let hnb = poisoned::<u16>(gpu, t * h);
            let logits = poisoned::<f32>(gpu, t * e);
            let (ids, w) = (poisoned::<i32>(gpu, t * ko), poisoned::<f32>(gpu, t * ko));
            gpu.moe_norm_route_with(
                t,
                xd.ptr(),
                gd.ptr(),
                1e-6,
                h,
                rd.ptr(),
                hnb.ptr(),
                logits.ptr(),
                &tickets,
                if bias { bd.ptr() } else { 0 },
                &rc,
                ids.ptr(),
                w.ptr(),
                cluster,
                run == 1, // the second run with hnb fenced for a GEMV after it (`late` bit 2)
            )
            .unwrap();
            let got_hnb = gpu.to_host(&hnb).unwrap();
            let mism = got_hnb.iter().zip(&hnb_ref).filter(|(a, b)| a != b).count();
            let lg = gpu.to_host(&logits).unwrap();
            let want_lg: Vec<f32> = (0..t * e)
                .map(|i| {
                    let (ti, ei) = (i / e, i % e);
                    (0..h)
                        .map(|c| hn[ti * h + c] as f64 * router[ei * h + c] as f64)
                        .sum::<f64>() as f32
                })
                .collect();
            let (gi, gw) = (gpu.to_host(&ids).unwrap(), gpu.to_host(&w).unwrap());
            let (mut id_mism, mut want_w) = (0usize, Vec::new());
            for ti in 0..t {
                let bias_h = if bias { Some(&b) } else { None };
                let (idx, wt) = route(&mc, &lg[ti * e..(ti + 1) * e], bias_h.map(|v| &v[..]));
                let shared = (e..e + ns).map(|i| i as i32);
                id_mism += idx
                    .iter()
                    .map(|&i| i as i32)
                    .chain(shared)
                    .zip(&gi[ti * ko..(ti + 1) * ko])
                    .filter(|(a, b)| a != *b)
                    .count();
                want_w.extend(wt);
                want_w.extend(std::iter::repeat_n(1.0, ns));
            }
            let kernel = cluster.map_or("tickets".to_string(), |c| format!("cluster {c}"));
            let n = format!("{name} {kernel} run {run}");
            rep.check("moe_norm_route hnb", n.clone(), "bf16", mism as f64, 0.0);
            rep.check(
                "moe_norm_route lg",
                n.clone(),
                "f32",
                rel_err(&lg, &want_lg),
                1e-5,
            );
            rep.check("moe_norm_route ids", n.clone(), "i32", id_mism as f64, 0.0);
            rep.check("moe_norm_route w", n, "f32", rel_err(&gw, &want_w), 1e-5);
        }
    }
}

pub(super) fn moe(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_cuda::ops::RouteCfg;
    use mlaserve_model::layers::ffn::route;
    use mlaserve_model::Gating;
    for (case, &(e, k, gating, n_group, topk_group, norm, bias)) in [
        (
            64usize,
            6usize,
            Gating::Softmax,
            1usize,
            1usize,
            false,
            false,
        ),
        (160, 6, Gating::Softmax, 8, 3, false, false),
        (256, 8, Gating::Sigmoid, 8, 4, true, true),
        (256, 8, Gating::Sigmoid, 1, 1, true, true),
        (8, 2, Gating::Sigmoid, 4, 1, true, false),
    ]
    .iter()
    .enumerate()
    {
        // Shared-expert slices after the top-k: none, one, two (as the executor fuses them).
        let (t, ns) = (7, case % 3);
        let ko = k + ns;
        let mc = route_cfg_moe(e, k, gating, n_group, topk_group, norm, bias);
        let logits = rng.vec(t * e, 3.0);
        let b = rng.vec(e, 0.5);
        let (ld, bd) = (gpu.upload(&logits).unwrap(), gpu.upload(&b).unwrap());
        let ids = poisoned::<i32>(gpu, t * ko);
        let w = poisoned::<f32>(gpu, t * ko);
        let rc = RouteCfg {
            experts: e,
            top_k: k,
            gating: if gating == Gating::Softmax { 0 } else { 1 },
            n_group,
            topk_group,
            norm,
            scale: 2.5,
            shared: ns,
        };
        gpu.moe_route(
            t,
            ld.ptr(),
            if bias { bd.ptr() } else { 0 },
            &rc,
            ids.ptr(),
            w.ptr(),
        )
        .unwrap();
        let (gi, gw) = (gpu.to_host(&ids).unwrap(), gpu.to_host(&w).unwrap());
        let (mut mism, mut want_w) = (0usize, Vec::new());
        for ti in 0..t {
            let (idx, wt) = route(
                &mc,
                &logits[ti * e..(ti + 1) * e],
                if bias { Some(&b) } else { None },
            );
            let shared = (e..e + ns).map(|i| i as i32);
            mism += idx
                .iter()
                .map(|&i| i as i32)
                .chain(shared)
                .zip(&gi[ti * ko..(ti + 1) * ko])
                .filter(|(a, b)| a != *b)
                .count();
            want_w.extend(wt);
            want_w.extend(std::iter::repeat_n(1.0, ns));
        }
        let name = format!(
            "E{e} K{k}+{ns} {gating:?} groups {n_group}/{topk_group}{}",
            if bias { " bias" } else { "" }
        );
        rep.check("moe_route ids", name.clone(), "i32", mism as f64, 0.0);
        rep.check(
            "moe_route weights",
            name,
            "f32",
            rel_err(&gw, &want_w),
            1e-5,
        );
    }
    moe_norm_route(gpu, rng, rep);
    // Expert GEMV over pairs with a pointer table, one expert not held (zeros), then combine.
    let (t, k, n, rows, held, first) = (3usize, 2usize, 256usize, 96usize, 4usize, 2usize);
    let experts: Vec<Vec<f32>> = (0..held)
        .map(|_| round_bf(&rng.vec(rows * n, 0.1)))
        .collect();
    let bufs: Vec<DBuf<u16>> = experts
        .iter()
        .map(|w| {
            gpu.upload(&w.iter().map(|&v| bf(v)).collect::<Vec<_>>())
                .unwrap()
        })
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let ids: Vec<i32> = vec![2, 5, 3, 1, 4, 2]; // expert 1 is not held on this "rank"
    let x = round_bf(&rng.vec(t * n, 1.0));
    let (pd, id, xd) = (
        gpu.upload(&ptrs).unwrap(),
        gpu.upload(&ids).unwrap(),
        gpu.upload(&x.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap(),
    );
    let out = poisoned::<f32>(gpu, t * k * rows);
    gpu.moe_gemv(
        t * k,
        pd.ptr(),
        first,
        held,
        id.ptr(),
        xd.ptr(),
        k,
        n,
        rows,
        out.ptr(),
    )
    .unwrap();
    let mut want = vec![0f32; t * k * rows];
    for p in 0..t * k {
        let ex = ids[p] as usize;
        if ex < first || ex >= first + held {
            continue;
        }
        let r = gemm_ref(
            &x[(p / k) * n..(p / k + 1) * n],
            &experts[ex - first],
            1,
            rows,
            n,
        );
        want[p * rows..(p + 1) * rows].copy_from_slice(&r);
    }
    let got = gpu.to_host(&out).unwrap();
    rep.check(
        "moe_gemv",
        format!("pairs{} n{n} rows{rows} held{held}", t * k),
        "bf16>f32",
        rel_err(&got, &want),
        1e-5,
    );
    let wts = rng.vec(t * k, 1.0);
    let x0 = rng.vec(t * rows, 1.0);
    let (x0d, wd) = (gpu.upload(&x0).unwrap(), gpu.upload(&wts).unwrap());
    gpu.moe_combine_pairs(t, x0d.ptr(), out.ptr(), wd.ptr(), k, rows)
        .unwrap();
    let mut want_x = x0.clone();
    for ti in 0..t {
        for j in 0..k {
            for i in 0..rows {
                want_x[ti * rows + i] += wts[ti * k + j] * want[(ti * k + j) * rows + i];
            }
        }
    }
    rep.check(
        "moe_combine_pairs",
        format!("T{t} K{k} H{rows}"),
        "f32",
        rel_err(&gpu.to_host(&x0d).unwrap(), &want_x),
        1e-5,
    );
    // The fused expert GEMVs against the chains they replace, bit for bit: gate|up with the
    // SwiGLU epilogue (each expert read as [2f, n], f = rows / 2) against moe_gemv over the
    // 2f rows + silu_mul; down with the combine epilogue (experts [rows, n], act [pairs, n])
    // against moe_gemv + moe_combine_pairs. Expert 1 is not held: its pairs give zeros. The
    // id sets: three tokens of two slots, experts taken by several tokens, six tokens of one
    // slot (each pair reads its expert).
    let f = rows / 2;
    let sets: [(usize, usize, Vec<i32>); 3] = [
        (t, k, ids.clone()),
        (3, 2, vec![2, 3, 2, 3, 2, 3]),
        (6, 1, vec![2, 2, 1, 2, 2, 2]),
    ];
    for (t, k, ids) in sets {
        let pairs = t * k;
        let id = gpu.upload(&ids).unwrap();
        let xs = round_bf(&rng.vec(t * n, 1.0));
        let xd = gpu
            .upload(&xs.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let gu = poisoned::<f32>(gpu, pairs * rows);
        let (pp, ip) = (pd.ptr(), id.ptr());
        gpu.moe_gemv(pairs, pp, first, held, ip, xd.ptr(), k, n, rows, gu.ptr())
            .unwrap();
        let act_fused = poisoned::<u16>(gpu, pairs * f);
        gpu.moe_gemv_swiglu(
            pairs,
            pp,
            first,
            held,
            ip,
            xd.ptr(),
            k,
            k,
            n,
            f,
            SliceViews::NONE,
            act_fused.ptr(),
        )
        .unwrap();
        let act_ref = poisoned::<u16>(gpu, pairs * f);
        gpu.silu_mul(gu.ptr(), act_ref.ptr(), f, pairs).unwrap();
        let (a, b) = (
            gpu.to_host(&act_fused).unwrap(),
            gpu.to_host(&act_ref).unwrap(),
        );
        let mism = a.iter().zip(&b).filter(|(a, b)| a != b).count();
        rep.check(
            "moe_gemv_swiglu",
            format!("T{t} K{k} ids {ids:?} n{n} f{f} vs moe_gemv+silu_mul"),
            "bf16",
            mism as f64,
            0.0,
        );
        let act = round_bf(&rng.vec(pairs * n, 1.0));
        let act_d = gpu
            .upload(&act.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let wts = rng.vec(pairs, 1.0);
        let wd = gpu.upload(&wts).unwrap();
        // Row counts that are and are not a multiple of the kernel's 4 rows a block (the
        // experts' first `rc` rows), and fewer than 4.
        for rc in [rows, rows - 2, 3] {
            let label = format!("T{t} K{k} ids {ids:?} n{n} rows{rc}");
            let tab = (pp, first, held, ip);
            combine_vs_chain(
                gpu,
                rng,
                rep,
                (t, k),
                tab,
                act_d.ptr(),
                wd.ptr(),
                (n, rc),
                &label,
            );
        }
    }
    moe_slices(gpu, rng, rep);
    moe_combine_long_k(gpu, rng, rep);
    moe_route_nowait(gpu, rng, rep);
}

/// The combine at V2-Lite's down width (n = 1,408: six K steps a lane, not a multiple of the
/// four a warp loads at once) and one token of 8 slots, with and without its first weights
/// before the wait, bit for bit `moe_gemv` + `moe_combine_pairs`: the early registers carry
/// into the loop's second round. Experts 0 and 7 are not held (first = 1, held = 6).
fn moe_combine_long_k(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    let (t, k, n, first, held) = (1usize, 8usize, 1408usize, 1usize, 6usize);
    let ids: Vec<i32> = vec![3, 1, 7, 6, 2, 0, 5, 4];
    for rows in [20usize, 19] {
        let bufs: Vec<DBuf<u16>> = (0..held)
            .map(|_| {
                let w = round_bf(&rng.vec(rows * n, 0.1));
                gpu.upload(&w.iter().map(|&v| bf(v)).collect::<Vec<_>>())
                    .unwrap()
            })
            .collect();
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
        let (pd, id) = (gpu.upload(&ptrs).unwrap(), gpu.upload(&ids).unwrap());
        let act = round_bf(&rng.vec(t * k * n, 1.0));
        let act_d = gpu
            .upload(&act.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap();
        let wd = gpu.upload(&rng.vec(t * k, 1.0)).unwrap();
        let label = format!("T{t} K{k} n{n} rows{rows}");
        let tab = (pd.ptr(), first, held, id.ptr());
        combine_vs_chain(
            gpu,
            rng,
            rep,
            (t, k),
            tab,
            act_d.ptr(),
            wd.ptr(),
            (n, rows),
            &label,
        );
    }
}

/// `moe_gemv_combine` over `t` tokens of `k` slots (pointer table `pp` from expert `first`,
/// `held` of them, ids at `ip`; act [t k, n] bf16, weights wd [t k]) into rows of x, without
/// and with its first weights before the wait (ids_final: they were uploaded before), each
/// bit for bit `moe_gemv` + `moe_combine_pairs` on the same x.
#[allow(clippy::too_many_arguments)]
fn combine_vs_chain(
    gpu: &Gpu,
    rng: &mut Rng,
    rep: &mut Report,
    (t, k): (usize, usize),
    (pp, first, held, ip): (u64, usize, usize, u64),
    act: u64,
    wd: u64,
    (n, rows): (usize, usize),
    label: &str,
) {
    let y = poisoned::<f32>(gpu, t * k * rows);
    gpu.moe_gemv(t * k, pp, first, held, ip, act, 1, n, rows, y.ptr())
        .unwrap();
    let x0 = rng.vec(t * rows, 1.0);
    let xa = gpu.upload(&x0).unwrap();
    gpu.moe_combine_pairs(t, xa.ptr(), y.ptr(), wd, k, rows)
        .unwrap();
    let want = gpu.to_host(&xa).unwrap();
    for early in [false, true] {
        let xb = gpu.upload(&x0).unwrap();
        let ex = (first, held, ip, act, wd);
        gpu.moe_gemv_combine_after(t, k, pp, ex, n, rows, SliceViews::NONE, xb.ptr(), early)
            .unwrap();
        let mism = gpu
            .to_host(&xb)
            .unwrap()
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let how = if early { ", ids final" } else { "" };
        rep.check(
            "moe_gemv_combine",
            format!("{label}{how} vs moe_gemv+combine"),
            "f32",
            mism as f64,
            0.0,
        );
    }
}

/// The shared slices without their wait on the real chain (common.cuh's second exception):
/// `moe_norm_route_cl` writes and fences hnb, then `moe_gemv_swiglu`'s slice blocks read it
/// without waiting for the routing to complete — many times, hnb poisoned (NaN) before each
/// routing, every act row bit for bit the waiting chain's. V2-Lite's router (64 experts, top
/// 6, 2 slices, H 2,048), 4 distinct routed matrices behind the 64 ids. A smoke test of the
/// chain as the executor launches it, not a proof that the fence is needed: block 0's stores
/// are likely in L2 long before the routing lets the GEMV in, fence or not.
fn moe_route_nowait(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_cuda::ops::RouteCfg;
    let (e, k, ns, h, f) = (64usize, 6usize, 2usize, 2048usize, 128usize);
    let rc = RouteCfg {
        experts: e,
        top_k: k,
        gating: 0,
        n_group: 1,
        topk_group: 1,
        norm: false,
        scale: 1.0,
        shared: ns,
    };
    if !gpu.shared_nowait(&rc, h) {
        // On sm_90 the path is the default: its coverage is not optional unless a switch
        // turned it off on purpose.
        let off = [
            "MLASERVE_SHARED_NOWAIT",
            "MLASERVE_CLUSTER_ROUTE",
            "MLASERVE_ROUTE_LATE",
        ]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| s == "0"));
        if gpu.arch.starts_with("sm_90") && !off {
            rep.check("moe_route_nowait", "taken on sm_90".into(), "-", 1.0, 0.0);
        }
        println!(
            "moe_route_nowait: the slices wait on {} here, nothing to check",
            gpu.arch
        );
        return;
    }
    let up = |v: &[f32]| {
        gpu.upload(&v.iter().map(|&x| bf(x)).collect::<Vec<_>>())
            .unwrap()
    };
    let fs = ns * f;
    let mats: Vec<_> = (0..4)
        .map(|_| up(&round_bf(&rng.vec(2 * f * h, 0.05))))
        .collect();
    let sgu = up(&round_bf(&rng.vec(2 * fs * h, 0.05)));
    let mut ptrs: Vec<u64> = (0..e).map(|i| mats[i % 4].ptr()).collect();
    for j in 0..ns {
        ptrs.push(sgu.at(j * f * h));
    }
    let gup = gpu.upload(&ptrs).unwrap();
    let views = SliceViews { e_routed: e, fs };
    let (x, gamma, router) = (rng.vec(h, 2.0), rng.vec(h, 1.0), rng.vec(e * h, 0.2));
    let (xd, gd, rd) = (
        gpu.upload(&x).unwrap(),
        gpu.upload(&gamma).unwrap(),
        gpu.upload(&router).unwrap(),
    );
    let tickets = gpu.upload(&[0u32]).unwrap();
    let (ko, held) = (k + ns, e + ns);
    // Every buffer allocated (and poisoned) before the routing, so the two launches are
    // back to back in the stream, as in the executor.
    let chain = |nowait: bool| -> Vec<u16> {
        let hnb = poisoned::<u16>(gpu, h);
        let logits = poisoned::<f32>(gpu, e);
        let (ids, w) = (poisoned::<i32>(gpu, ko), poisoned::<f32>(gpu, ko));
        let act = poisoned::<u16>(gpu, ko * f);
        gpu.moe_norm_route_with(
            1,
            xd.ptr(),
            gd.ptr(),
            1e-6,
            h,
            rd.ptr(),
            hnb.ptr(),
            logits.ptr(),
            &tickets,
            0,
            &rc,
            ids.ptr(),
            w.ptr(),
            Some(8),
            nowait,
        )
        .unwrap();
        let ex = (0, held, ids.ptr(), hnb.ptr(), ko, k);
        gpu.moe_gemv_swiglu_after(ko, gup.ptr(), ex, h, f, views, act.ptr(), nowait)
            .unwrap();
        gpu.to_host(&act).unwrap()
    };
    let want = chain(false);
    // The reference itself: no NaN or infinity (the routing wrote hnb over its poison).
    let bad = want.iter().filter(|&&b| b & 0x7f80 == 0x7f80).count();
    rep.check(
        "moe_route_nowait",
        "waiting chain finite".into(),
        "bf16",
        bad as f64,
        0.0,
    );
    let reps = 200;
    let mism: usize = (0..reps)
        .map(|_| {
            let got = chain(true);
            got.iter().zip(&want).filter(|(a, b)| a != b).count()
        })
        .sum();
    rep.check(
        "moe_gemv_swiglu",
        format!("after moe_norm_route_cl, slices without the wait x{reps} (E{e} K{k}+{ns} H{h})"),
        "bf16",
        mism as f64,
        0.0,
    );
}

/// The fused expert kernels (meant for one token; two here) with shared-expert slices read in place (views into the
/// shared MLP's gate|up [2fs, H] and down [H, fs], `SliceViews`): the SwiGLU rows of a slice
/// bit for bit those of the shared MLP run as one expert (moe_gemv over 2fs rows + silu_mul),
/// and the combine against routed + shared MLP in f64 (the slices sum their parts apart).
fn moe_slices(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    let (h, f, fs, e) = (256usize, 64usize, 128usize, 4usize);
    let up = |v: &[f32]| {
        gpu.upload(&v.iter().map(|&x| bf(x)).collect::<Vec<_>>())
            .unwrap()
    };
    let gus: Vec<Vec<f32>> = (0..e).map(|_| round_bf(&rng.vec(2 * f * h, 0.1))).collect();
    let dns: Vec<Vec<f32>> = (0..e).map(|_| round_bf(&rng.vec(h * f, 0.1))).collect();
    let (sh_gu, sh_dn) = (
        round_bf(&rng.vec(2 * fs * h, 0.1)),
        round_bf(&rng.vec(h * fs, 0.1)),
    );
    let (gu_d, dn_d): (Vec<_>, Vec<_>) = (
        gus.iter().map(|w| up(w)).collect(),
        dns.iter().map(|w| up(w)).collect(),
    );
    let (sgu, sdn) = (up(&sh_gu), up(&sh_dn));
    let slices = fs / f;
    let mut gu_ptrs: Vec<u64> = gu_d.iter().map(|b| b.ptr()).collect();
    let mut dn_ptrs: Vec<u64> = dn_d.iter().map(|b| b.ptr()).collect();
    for j in 0..slices {
        gu_ptrs.push(sgu.at(j * f * h));
        dn_ptrs.push(sdn.at(j * f));
    }
    let (gup, dnp) = (gpu.upload(&gu_ptrs).unwrap(), gpu.upload(&dn_ptrs).unwrap());
    // Two tokens of 2 routed slots + the 2 slices.
    let (t, k) = (2usize, 4usize);
    let ids: Vec<i32> = vec![1, 3, 4, 5, 2, 0, 4, 5];
    let wts = vec![0.7f32, -0.4, 1.0, 1.0, 0.2, 0.9, 1.0, 1.0];
    let x = round_bf(&rng.vec(t * h, 1.0));
    let (idd, xd, wd) = (gpu.upload(&ids).unwrap(), up(&x), gpu.upload(&wts).unwrap());
    let views = SliceViews { e_routed: e, fs };
    let held = e + slices;
    // k_routed 2: the slices' blocks first, their first weights loaded before the wait; 4:
    // pairs in order. The same bits either way, and with slice ids the routing would not
    // write (slot 2 of token 1 holds a routed expert: that block reloads).
    let swiglu = |ids: &DBuf<i32>, k_routed: usize| {
        let act = poisoned::<u16>(gpu, t * k * f);
        gpu.moe_gemv_swiglu(
            t * k,
            gup.ptr(),
            0,
            held,
            ids.ptr(),
            xd.ptr(),
            k,
            k_routed,
            h,
            f,
            views,
            act.ptr(),
        )
        .unwrap();
        gpu.to_host(&act).unwrap()
    };
    let act_h = swiglu(&idd, 2);
    let act = gpu.upload(&act_h).unwrap();
    let odd: Vec<i32> = vec![1, 3, 4, 5, 2, 0, 3, 5];
    let odd_d = gpu.upload(&odd).unwrap();
    for (name, ids_d, kr) in [("in order", &idd, 4), ("odd ids", &odd_d, 2)] {
        let a = swiglu(ids_d, kr);
        let b = if kr == 2 {
            swiglu(ids_d, 4)
        } else {
            act_h.clone()
        };
        let mism = a.iter().zip(&b).filter(|(a, b)| a != b).count();
        rep.check(
            "moe_gemv_swiglu",
            format!("T{t} slices early vs {name} (k_routed {kr})"),
            "bf16",
            mism as f64,
            0.0,
        );
    }
    // The slices without their wait (`nowait`, the executor's path after the cluster
    // routing): the same bits. x was written before this launch, as the routing kernel writes
    // and fences it before letting it in (the e2e and graph tests run that chain).
    let early = poisoned::<u16>(gpu, t * k * f);
    let ex = (0, held, idd.ptr(), xd.ptr(), k, 2);
    gpu.moe_gemv_swiglu_after(t * k, gup.ptr(), ex, h, f, views, early.ptr(), true)
        .unwrap();
    let mism = (gpu.to_host(&early).unwrap().iter())
        .zip(&act_h)
        .filter(|(a, b)| a != b)
        .count();
    rep.check(
        "moe_gemv_swiglu",
        format!("T{t} slices without the wait"),
        "bf16",
        mism as f64,
        0.0,
    );
    // The shared MLP as one expert of width fs, for each token.
    let one = gpu.upload(&[sgu.ptr()]).unwrap();
    let zero = gpu.upload(&[0i32; 2]).unwrap();
    let gu_sh = poisoned::<f32>(gpu, t * 2 * fs);
    gpu.moe_gemv(
        t,
        one.ptr(),
        0,
        1,
        zero.ptr(),
        xd.ptr(),
        1,
        h,
        2 * fs,
        gu_sh.ptr(),
    )
    .unwrap();
    let act_sh = poisoned::<u16>(gpu, t * fs);
    gpu.silu_mul(gu_sh.ptr(), act_sh.ptr(), fs, t).unwrap();
    let act_sh = gpu.to_host(&act_sh).unwrap();
    let mism = (0..t * slices * f)
        .filter(|&o| {
            let (ti, j, i) = (o / (slices * f), o / f % slices, o % f);
            act_h[(ti * k + 2 + j) * f + i] != act_sh[ti * fs + j * f + i]
        })
        .count();
    rep.check(
        "moe_gemv_swiglu",
        format!("T{t}, slices {slices} of fs{fs} (views) f{f} n{h} vs shared MLP"),
        "bf16",
        mism as f64,
        0.0,
    );
    // The routed pairs of the same launch against moe_gemv + silu_mul over them alone.
    let routed: Vec<i32> = vec![ids[0], ids[1], ids[4], ids[5]];
    let rd = gpu.upload(&routed).unwrap();
    let gu_r = poisoned::<f32>(gpu, 4 * 2 * f);
    gpu.moe_gemv(
        4,
        gup.ptr(),
        0,
        e,
        rd.ptr(),
        xd.ptr(),
        2,
        h,
        2 * f,
        gu_r.ptr(),
    )
    .unwrap();
    let act_r = poisoned::<u16>(gpu, 4 * f);
    gpu.silu_mul(gu_r.ptr(), act_r.ptr(), f, 4).unwrap();
    let act_r = gpu.to_host(&act_r).unwrap();
    let mism = (0..4 * f)
        .filter(|&o| {
            let (pr, i) = (o / f, o % f);
            act_h[((pr / 2) * k + pr % 2) * f + i] != act_r[o]
        })
        .count();
    rep.check(
        "moe_gemv_swiglu",
        format!("T{t}, routed pairs beside {slices} slices f{f} n{h} vs moe_gemv+silu_mul"),
        "bf16",
        mism as f64,
        0.0,
    );
    let x0 = rng.vec(t * h, 1.0);
    let xo = gpu.upload(&x0).unwrap();
    // as the engine launches it after the SwiGLU kernel: ids final, the slices' first rows
    // (fs apart) loaded before the wait
    let ex = (0, held, idd.ptr(), act.ptr(), wd.ptr());
    gpu.moe_gemv_combine_after(t, k, dnp.ptr(), ex, f, h, views, xo.ptr(), true)
        .unwrap();
    let got = gpu.to_host(&xo).unwrap();
    let a = |i: usize| unbf(act_h[i]) as f64;
    let want: Vec<f32> = (0..t * h)
        .map(|o| {
            let (ti, r) = (o / h, o % h);
            let mut v = x0[o] as f64;
            for slot in 0..2 {
                let d = &dns[ids[ti * k + slot] as usize];
                let pa = (ti * k + slot) * f;
                let dot: f64 = (0..f).map(|i| d[r * f + i] as f64 * a(pa + i)).sum();
                v += wts[ti * k + slot] as f64 * dot;
            }
            v + (0..fs)
                .map(|i| sh_dn[r * fs + i] as f64 * unbf(act_sh[ti * fs + i]) as f64)
                .sum::<f64>()
        } as f32)
        .collect();
    rep.check(
        "moe_gemv_combine",
        format!(
            "T{t}, slices {slices} of fs{fs} (views) rows{h}, ids final vs routed + shared MLP"
        ),
        "f32",
        rel_err(&got, &want),
        1e-5,
    );
}

/// Grouped expert GEMM over pairs sorted on the GPU (`mlaserve_cuda::moe_grouped`): the sort
/// exactly against a stable CPU sort (order, pos, offsets, tile prefix; experts outside the
/// held range dropped), the GEMM (gathered rows and sorted rows; n and k with partial tiles;
/// an expert without weights gives zeros) against the CPU in f64 of bf16 inputs — 64-row
/// tiles on sm_90a by the wgmma kernel (`moe_gemm_wg`), else by mma.sync.
pub(super) fn moe_grouped(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    if !gpu.has_flash_attn() {
        println!("moe_grouped: {} has no bf16 mma, not run", gpu.arch);
        return;
    }
    // (tokens, top-k, experts in the model, held, first held, n, k, expert without weights)
    let cases = [
        (
            37usize, 6usize, 8usize, 8usize, 0usize, 200usize, 264usize, None,
        ),
        (50, 4, 10, 5, 3, 128, 128, Some(1usize)),
        (256, 6, 64, 64, 0, 136, 72, None),
        // >= 32 rows per expert on average: 64-row tiles (moe_gemm_m4).
        (400, 6, 16, 16, 0, 200, 136, Some(3)),
        (2048, 8, 64, 32, 16, 128, 64, None),
        // V2-Lite's routing at a 600-token prefill: on sm_90a the wgmma kernel (64 x 256
        // blocks; 384 features: a partial block), k of 8 atoms.
        (600, 6, 64, 64, 0, 384, 512, Some(7)),
    ];
    for (t, k, experts, held, first, n, kd, missing) in cases {
        let pairs = t * k;
        let ids: Vec<i32> = (0..pairs).map(|_| rng.below(experts) as i32).collect();
        let ws: Vec<Vec<f32>> = (0..held).map(|_| round_bf(&rng.vec(n * kd, 0.1))).collect();
        let bufs: Vec<DBuf<u16>> = ws
            .iter()
            .map(|w| {
                gpu.upload(&w.iter().map(|&v| bf(v)).collect::<Vec<_>>())
                    .unwrap()
            })
            .collect();
        let ptrs: Vec<u64> = bufs
            .iter()
            .enumerate()
            .map(|(e, b)| if Some(e) == missing { 0 } else { b.ptr() })
            .collect();
        let (pd, idd) = (gpu.upload(&ptrs).unwrap(), gpu.upload(&ids).unwrap());
        let sorted = gpu.moe_sort(pairs, idd.ptr(), first, held).unwrap();
        // CPU: stable sort by local expert.
        let mut want_order: Vec<i32> = Vec::new();
        let mut want_off = vec![0i32];
        let mut want_tiles = vec![0i32];
        let bm = moe_tile_rows(pairs, held) as i32;
        let mut want_pos = vec![-1i32; pairs];
        for e in 0..held {
            for (pi, &id) in ids.iter().enumerate() {
                if id as usize == first + e {
                    want_pos[pi] = want_order.len() as i32;
                    want_order.push(pi as i32);
                }
            }
            let c = want_order.len() as i32 - want_off[e];
            want_off.push(want_order.len() as i32);
            want_tiles.push(want_tiles[e] + (c + bm - 1) / bm);
        }
        let valid = want_order.len();
        let got_order = gpu.to_host(&sorted.order).unwrap();
        let mism = (got_order[..valid] != want_order[..]) as usize
            + (gpu.to_host(&sorted.pos).unwrap() != want_pos) as usize
            + (gpu.to_host(&sorted.offsets).unwrap() != want_off) as usize
            + (gpu.to_host(&sorted.tile_off).unwrap() != want_tiles) as usize;
        let name = format!("pairs{pairs} E{experts} held{held} n{n} k{kd} bm{bm}");
        rep.check("moe_sort", name.clone(), "i32", mism as f64, 0.0);
        // Gathered rows (gate/up: x row = pair / k), then sorted rows (down: x row = r).
        for gather in [true, false] {
            let xs = round_bf(&rng.vec(if gather { t } else { pairs } * kd, 1.0));
            let xsd = gpu
                .upload(&xs.iter().map(|&v| bf(v)).collect::<Vec<_>>())
                .unwrap();
            let out = poisoned::<f32>(gpu, pairs * n);
            let x_div = if gather { k } else { 1 };
            gpu.moe_gemm(
                &sorted,
                None,
                pd.ptr(),
                xsd.ptr(),
                x_div,
                gather,
                n,
                kd,
                out.ptr(),
            )
            .unwrap();
            let got = gpu.to_host(&out).unwrap();
            let mut want = vec![0f32; valid * n];
            for r in 0..valid {
                let e = ids[want_order[r] as usize] as usize - first;
                if Some(e) == missing {
                    continue;
                }
                let src = if gather {
                    want_order[r] as usize / k
                } else {
                    r
                };
                let y = gemm_ref(&xs[src * kd..(src + 1) * kd], &ws[e], 1, n, kd);
                want[r * n..(r + 1) * n].copy_from_slice(&y);
            }
            rep.check(
                "moe_gemm",
                format!("{name} {}", if gather { "gathered" } else { "sorted" }),
                "bf16>f32",
                rel_err(&got[..valid * n], &want),
                1e-5,
            );
        }
        // The SwiGLU in the gate|up product's epilogue (the matrices as [2f, k], f = n / 2;
        // sm_90a, unless MLASERVE_MOE_GLU=0): bit for bit the product into f32 then silu_mul.
        if gpu.moe_glu_fits(pairs, held) && n % 2 == 0 {
            let f = n / 2;
            let xs: Vec<u16> = rng.vec(t * kd, 1.0).iter().map(|&v| bf(v)).collect();
            let xsd = gpu.upload(&xs).unwrap();
            let gu = poisoned::<f32>(gpu, pairs * n);
            gpu.moe_gemm(&sorted, None, pd.ptr(), xsd.ptr(), k, true, n, kd, gu.ptr())
                .unwrap();
            let want = poisoned::<u16>(gpu, pairs * f);
            gpu.silu_mul(gu.ptr(), want.ptr(), f, valid).unwrap();
            let got = poisoned::<u16>(gpu, pairs * f);
            gpu.moe_gemm_glu(&sorted, pd.ptr(), xsd.ptr(), k, true, f, kd, got.ptr())
                .unwrap();
            let (got, want) = (gpu.to_host(&got).unwrap(), gpu.to_host(&want).unwrap());
            let mism = (0..valid * f).filter(|&i| got[i] != want[i]).count();
            rep.check(
                "moe_gemm_glu",
                format!("{name} f{f}"),
                "bf16>bf16",
                mism as f64,
                0.0,
            );
        }
    }
}
