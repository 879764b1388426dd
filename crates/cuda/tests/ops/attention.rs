//! Attention: the unabsorbed prefill (flash and tensor-core paths), the absorbed projections,
//! the paged decode and the cluster attention of a one-token step.

use super::*;

/// A paged bf16 latent cache with shuffled blocks, and its rows as f32.
struct Paged {
    cache: Vec<u16>,
    table: Vec<i32>,
    bs: usize,
    w: usize,
}

impl Paged {
    fn new(rng: &mut Rng, positions: usize, bs: usize, w: usize) -> Self {
        let nb = positions.div_ceil(bs) + 3;
        let mut table: Vec<i32> = (0..nb as i32).collect();
        for i in (1..table.len()).rev() {
            table.swap(i, rng.below(i + 1));
        }
        let cache = rng.vec(nb * bs * w, 1.0).iter().map(|&v| bf(v)).collect();
        Paged {
            cache,
            table,
            bs,
            w,
        }
    }
    fn slot(&self, p: usize) -> usize {
        self.table[p / self.bs] as usize * self.bs + p % self.bs
    }
    fn row(&self, p: usize) -> Vec<f32> {
        self.cache[self.slot(p) * self.w..][..self.w]
            .iter()
            .map(|&b| unbf(b))
            .collect()
    }
}

pub(super) fn attention(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    // Absorbed decode over the paged cache: several queries, dense and DSA-selected keys,
    // one split and several.
    for &(t, heads, l, r, ctx, splits, sparse) in &[
        (3, 16, 512, 64, 300, 1, false),
        (3, 16, 512, 64, 1000, 4, false),
        (2, 128, 512, 64, 700, 3, true),
        (4, 4, 64, 16, 40, 2, false),
    ] {
        let p = 32;
        let w = l + r;
        let paged = Paged::new(rng, ctx + t, 16, w);
        let q_lat = rng.vec(t * heads * l, 1.0);
        let q = rng.vec(t * heads * (p + r), 1.0);
        let scale = 0.07;
        let mut sel_off = vec![-1i32; t];
        let mut sel_pos = vec![0i32];
        let mut lists: Vec<Vec<usize>> = Vec::new();
        for (i, off) in sel_off.iter_mut().enumerate() {
            let pos = ctx + i;
            let keys: Vec<usize> = if sparse {
                let scores = rng.vec(pos + 1, 1.0);
                top_k(&scores, 256)
            } else {
                (0..=pos).collect()
            };
            if sparse {
                *off = sel_pos.len() as i32;
                sel_pos.extend(keys.iter().map(|&k| k as i32));
            }
            lists.push(keys);
        }
        let n_keys: Vec<i32> = lists.iter().map(|k| k.len() as i32).collect();
        let d = |v: &[i32]| gpu.upload(v).unwrap();
        let (nk, so, sp) = (d(&n_keys), d(&sel_off), d(&sel_pos));
        let bt_off = d(&vec![0i32; t]);
        let tables = d(&paged.table);
        let cache = gpu.upload(&paged.cache).unwrap();
        let (qld, qd) = (gpu.upload(&q_lat).unwrap(), gpu.upload(&q).unwrap());
        let part = poisoned::<f32>(gpu, t * heads * splits * l);
        let lse = poisoned::<f32>(gpu, t * heads * splits);
        let o_lat = poisoned::<u16>(gpu, t * heads * l);
        let dims = AttnDims {
            t,
            heads,
            p,
            r,
            v: 0,
            l,
            scale,
        };
        let keys = KeyLists {
            n_keys: nk.ptr(),
            sel_off: so.ptr(),
            sel_pos: sp.ptr(),
        };
        gpu.attn_mqa(
            &dims,
            qld.ptr(),
            qd.ptr(),
            cache.ptr(),
            &keys,
            tables.ptr(),
            bt_off.ptr(),
            16,
            splits,
            part.ptr(),
            lse.ptr(),
            o_lat.ptr(),
        )
        .unwrap();
        let got: Vec<f32> = gpu
            .to_host(&o_lat)
            .unwrap()
            .iter()
            .map(|&b| unbf(b))
            .collect();
        let rows: Vec<Vec<f32>> = (0..ctx + t).map(|pp| paged.row(pp)).collect();
        let mut want = vec![0f32; t * heads * l];
        let mut scratch = Vec::new();
        for i in 0..t {
            for h in 0..heads {
                let qp = &q[i * heads * (p + r) + h * (p + r) + p..][..r];
                attend(
                    &lists[i],
                    |j| (&rows[j][..l], &rows[j][l..], &rows[j][..l]),
                    &q_lat[(i * heads + h) * l..][..l],
                    qp,
                    scale,
                    &mut scratch,
                    &mut want[(i * heads + h) * l..][..l],
                );
            }
        }
        let name = format!(
            "T{t} N{heads} L{l} R{r} ctx{ctx} splits{splits}{}",
            if sparse { " topk256" } else { "" }
        );
        rep.check(
            "attn_mqa",
            name,
            "bf16 cache",
            rel_err(&got, &want),
            1.0 / 256.0,
        );
    }
    // Unabsorbed prefill over context: DeepSeek 192/128, GLM-5 256/256, tiny; dense and sparse.
    for &(heads, p, r, v, ctx, t, sparse) in &[
        (16, 128, 64, 128, 0, 37, false),
        (16, 128, 64, 128, 50, 20, false),
        (8, 192, 64, 256, 30, 25, true),
        (4, 32, 16, 32, 5, 9, false),
        (16, 128, 64, 128, 70, 130, false),
        (8, 192, 64, 256, 30, 70, false),
        (2, 64, 64, 128, 3, 66, false),
    ] {
        let s = ctx + t;
        let q = rng.vec(t * heads * (p + r), 1.0);
        let kn = rng.vec(s * heads * p, 1.0);
        let kpe = rng.vec(s * r, 1.0);
        let vals = rng.vec(s * heads * v, 1.0);
        let scale = (p as f32 + r as f32).powf(-0.5);
        let mut sel_off = vec![-1i32; t];
        let mut sel_pos = vec![0i32];
        let mut lists = Vec::new();
        for (i, off) in sel_off.iter_mut().enumerate() {
            let pos = ctx + i;
            let keys: Vec<usize> = if sparse && pos >= 16 {
                let sc = rng.vec(pos + 1, 1.0);
                let k = top_k(&sc, 16);
                *off = sel_pos.len() as i32;
                sel_pos.extend(k.iter().map(|&x| x as i32));
                k
            } else {
                (0..=pos).collect()
            };
            lists.push(keys);
        }
        let n_keys: Vec<i32> = lists.iter().map(|k| k.len() as i32).collect();
        let d = |x: &[i32]| gpu.upload(x).unwrap();
        let (nk, so, sp, kb) = (d(&n_keys), d(&sel_off), d(&sel_pos), d(&vec![0i32; t]));
        let (qd, knd, kpd, vd) = (
            gpu.upload(&q).unwrap(),
            gpu.upload(&kn).unwrap(),
            gpu.upload(&kpe).unwrap(),
            gpu.upload(&vals).unwrap(),
        );
        let out = poisoned::<f32>(gpu, t * heads * v);
        let dims = AttnDims {
            t,
            heads,
            p,
            r,
            v,
            l: 0,
            scale,
        };
        let keys = KeyLists {
            n_keys: nk.ptr(),
            sel_off: so.ptr(),
            sel_pos: sp.ptr(),
        };
        gpu.attn_mha(
            &dims,
            qd.ptr(),
            knd.ptr(),
            kpd.ptr(),
            vd.ptr(),
            out.ptr(),
            &keys,
            kb.ptr(),
        )
        .unwrap();
        let got = gpu.to_host(&out).unwrap();
        let mut want = vec![0f32; t * heads * v];
        let mut scratch = Vec::new();
        for i in 0..t {
            for h in 0..heads {
                let qr = &q[i * heads * (p + r) + h * (p + r)..][..p + r];
                attend(
                    &lists[i],
                    |j| {
                        (
                            &kn[(j * heads + h) * p..][..p],
                            &kpe[j * r..][..r],
                            &vals[(j * heads + h) * v..][..v],
                        )
                    },
                    &qr[..p],
                    &qr[p..],
                    scale,
                    &mut scratch,
                    &mut want[(i * heads + h) * v..][..v],
                );
            }
        }
        let name = format!(
            "N{heads} qk{} v{v} ctx{ctx} T{t}{}",
            p + r,
            if sparse { " topk16" } else { "" }
        );
        rep.check("attn_mha", name.clone(), "f32", rel_err(&got, &want), 1e-4);
        // The tensor-core kernels holding these dims, on the same dense lists (bf16 q, k, v
        // and P).
        let fits = |f: &FaVariant| f.dq >= p + r && f.dv >= v && gpu.fa_check(&dims, f).is_ok();
        for f in fa_all_variants().filter(fits) {
            if sparse {
                break;
            }
            let tiles = fa_tiles(&[(0, t)], &n_keys, f.bm());
            let td = gpu.upload(&tiles).unwrap();
            let out = poisoned::<f32>(gpu, t * heads * v);
            gpu.attn_flash(
                &dims,
                &f,
                qd.ptr(),
                knd.ptr(),
                kpd.ptr(),
                vd.ptr(),
                s,
                out.ptr(),
                td.ptr(),
                tiles.len() / 2,
                nk.ptr(),
                kb.ptr(),
            )
            .unwrap();
            let got = gpu.to_host(&out).unwrap();
            let err = rel_err(&got, &want);
            rep.check(f.kernel, name.clone(), "bf16 qkv", err, 1.0 / 128.0);
        }
    }
    // Cache write + gather back (exact), and the DSA indexer scores.
    let (t, w, l, bs) = (5, 576, 512, 16);
    let paged = Paged::new(rng, 64, bs, w);
    let cache = gpu.upload(&paged.cache).unwrap();
    let kv = rng.vec(t * (w + 8), 1.0);
    let slots: Vec<i64> = (0..t).map(|i| paged.slot(40 + i) as i64).collect();
    let (kvd, sd) = (gpu.upload(&kv).unwrap(), gpu.upload(&slots).unwrap());
    gpu.cache_write_bf16(t, kvd.ptr(), w + 8, sd.ptr(), cache.ptr(), w)
        .unwrap();
    let kvc = poisoned::<u16>(gpu, t * l);
    let kpe = poisoned::<f32>(gpu, t * (w - l));
    gpu.gather_latent(t, cache.ptr(), sd.ptr(), w, l, kvc.ptr(), kpe.ptr())
        .unwrap();
    let (gc, gp) = (gpu.to_host(&kvc).unwrap(), gpu.to_host(&kpe).unwrap());
    let mut mism = 0;
    for i in 0..t {
        for c in 0..w {
            let want = bf(kv[i * (w + 8) + c]);
            let got = if c < l {
                gc[i * l + c]
            } else {
                bf(gp[i * (w - l) + c - l])
            };
            mism += (got != want) as usize;
        }
    }
    rep.check(
        "cache_write+gather",
        format!("T{t} W{w} L{l}"),
        "f32>bf16",
        mism as f64,
        0.0,
    );
    // The fused latent-row kernel against RMSNorm, RoPE and the cache write in turn (each
    // checked against the CPU above): the same kv rows and cache bytes, bit for bit.
    let r = w - l;
    let (nw, cs, sn) = (
        rng.vec(l, 1.0),
        rng.vec(t * r / 2, 1.0),
        rng.vec(t * r / 2, 1.0),
    );
    let (nwd, csd, snd) = (
        gpu.upload(&nw).unwrap(),
        gpu.upload(&cs).unwrap(),
        gpu.upload(&sn).unwrap(),
    );
    let (kv_a, kv_b) = (gpu.upload(&kv).unwrap(), gpu.upload(&kv).unwrap());
    let (ca, cb) = (
        gpu.upload(&paged.cache).unwrap(),
        gpu.upload(&paged.cache).unwrap(),
    );
    let ks = w + 8;
    gpu.rms_norm(
        t,
        kv_a.ptr(),
        ks,
        0,
        nwd.ptr(),
        kv_a.ptr(),
        ks,
        0,
        0,
        l,
        1e-6,
    )
    .unwrap();
    gpu.rope(t, kv_a.ptr(), ks, 1, 0, l, r, csd.ptr(), snd.ptr())
        .unwrap();
    gpu.cache_write_bf16(t, kv_a.ptr(), ks, sd.ptr(), ca.ptr(), w)
        .unwrap();
    gpu.kv_finish(
        t,
        kv_b.ptr(),
        ks,
        nwd.ptr(),
        l,
        r,
        1e-6,
        csd.ptr(),
        snd.ptr(),
        sd.ptr(),
        cb.ptr(),
    )
    .unwrap();
    let (ka, kb2) = (gpu.to_host(&kv_a).unwrap(), gpu.to_host(&kv_b).unwrap());
    let (cah, cbh) = (gpu.to_host(&ca).unwrap(), gpu.to_host(&cb).unwrap());
    let mism = ka
        .iter()
        .zip(&kb2)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count()
        + cah.iter().zip(&cbh).filter(|(a, b)| a != b).count();
    rep.check(
        "kv_finish",
        format!("T{t} L{l} R{r} vs rms_norm+rope+cache_write"),
        "f32>bf16",
        mism as f64,
        0.0,
    );
    let (hi, d, ctx, t): (usize, usize, usize, usize) = (8, 64, 90, 3);
    let positions = ctx + t;
    let nb = positions.div_ceil(bs) + 1;
    let table: Vec<i32> = (0..nb as i32).rev().collect();
    let kcache = rng.vec(nb * bs * d, 1.0);
    let iq = rng.vec(t * hi * d, 1.0);
    let wt = rng.vec(t * hi, 1.0);
    let n_keys: Vec<i32> = (0..t).map(|i| (ctx + i + 1) as i32).collect();
    let max_keys = positions;
    let (iqd, wtd, kcd, nkd, btd, bo) = (
        gpu.upload(&iq).unwrap(),
        gpu.upload(&wt).unwrap(),
        gpu.upload(&kcache).unwrap(),
        gpu.upload(&n_keys).unwrap(),
        gpu.upload(&table).unwrap(),
        gpu.upload(&vec![0i32; t]).unwrap(),
    );
    let scores = poisoned::<f32>(gpu, t * max_keys);
    gpu.dsa_scores(
        t,
        iqd.ptr(),
        wtd.ptr(),
        kcd.ptr(),
        scores.ptr(),
        nkd.ptr(),
        btd.ptr(),
        bo.ptr(),
        bs,
        hi,
        d,
        max_keys,
    )
    .unwrap();
    let got = gpu.to_host(&scores).unwrap();
    let (mut g, mut want) = (Vec::new(), Vec::new());
    for i in 0..t {
        for j in 0..n_keys[i] as usize {
            let slot = table[j / bs] as usize * bs + j % bs;
            let k = &kcache[slot * d..][..d];
            let mut s = 0f32;
            for h in 0..hi {
                let dot: f32 = iq[(i * hi + h) * d..][..d]
                    .iter()
                    .zip(k)
                    .map(|(a, b)| a * b)
                    .sum();
                s += wt[i * hi + h]
                    * (hi as f32).powf(-0.5)
                    * (dot * (d as f32).powf(-0.5)).max(0.0);
            }
            want.push(s);
            g.push(got[i * max_keys + j]);
        }
    }
    rep.check(
        "dsa_scores",
        format!("T{t} Hi{hi} D{d} keys{max_keys}"),
        "f32",
        rel_err(&g, &want),
        1e-5,
    );
}

/// Per query at position `positions[i]`: dense causal keys 0..=pos, or (`topk`) the top-k of
/// random scores, ascending. Returns sel_off [T] (-1 dense), sel_pos and the lists.
fn key_lists(
    rng: &mut Rng,
    positions: &[usize],
    topk: Option<usize>,
) -> (Vec<i32>, Vec<i32>, Vec<Vec<usize>>) {
    let mut sel_off = vec![-1i32; positions.len()];
    let mut sel_pos = vec![0i32];
    let mut lists = Vec::new();
    for (i, &pos) in positions.iter().enumerate() {
        let keys: Vec<usize> = match topk {
            Some(k) => {
                let keys = top_k(&rng.vec(pos + 1, 1.0), k);
                sel_off[i] = sel_pos.len() as i32;
                sel_pos.extend(keys.iter().map(|&x| x as i32));
                keys
            }
            None => (0..=pos).collect(),
        };
        lists.push(keys);
    }
    (sel_off, sel_pos, lists)
}

/// The tensor-core absorbed decode (mla_decode.cu, mla_decode_wgmma.cu), every variant,
/// against the CPU `attend` over the same bf16 cache rows: 8, 16, 20 (a partial head group),
/// 64 and 128 heads; 1-4 splits (empty splits included); dense causal and DSA top-k lists; key
/// counts 1, 64, 65 and others not multiples of the 64-key tile; block sizes 16 and 64. Bound
/// 2^-7 of max|ref|, one bf16 ulp of the largest output, as the tensor-core prefill kernels':
/// the f32 queries and P are rounded to bf16 on top of o_lat's own rounding (every variant,
/// whatever its arithmetic, gave the same 3.94e-3 on one case in session 5: output rounding).
/// Plus the fallback of `attn_mqa_tc` to the CUDA-core kernel for another latent width, at
/// attn_mqa's bound.
pub(super) fn attention_tc(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_cuda::mla_decode::{Early, MlaVariant};
    // (heads, query positions, splits, top-k, block size)
    type Case = (usize, &'static [usize], usize, Option<usize>, usize);
    let cases: &[Case] = &[
        (16, &[0, 63, 64, 300, 1000], 1, None, 16),
        // The newest row in its split's first tile (V2-Lite's b1 at 513 keys: 9 splits).
        (16, &[512], 9, None, 16),
        (16, &[5, 40, 200], 8, None, 16),
        (8, &[0, 200, 777], 2, None, 16),
        (16, &[0, 129, 700, 2000], 4, None, 64),
        (20, &[0, 90, 333], 2, None, 16),
        (128, &[1, 1000], 2, None, 16),
        (128, &[5, 700, 1500], 3, Some(256), 64),
        (64, &[250, 513], 1, Some(64), 16),
    ];
    let (l, r, p, scale) = (512usize, 64usize, 32usize, 0.07f32);
    let w = l + r;
    for &(heads, positions, splits, topk, bs) in cases {
        let t = positions.len();
        let paged = Paged::new(rng, positions.iter().max().unwrap() + 1, bs, w);
        let q_lat = rng.vec(t * heads * l, 1.0);
        let q = rng.vec(t * heads * (p + r), 1.0);
        let (sel_off, sel_pos, lists) = key_lists(rng, positions, topk);
        let n_keys: Vec<i32> = lists.iter().map(|k| k.len() as i32).collect();
        let d = |v: &[i32]| gpu.upload(v).unwrap();
        let (nk, so, sp) = (d(&n_keys), d(&sel_off), d(&sel_pos));
        let bt_off = d(&vec![0i32; t]);
        let tables = d(&paged.table);
        let cache = gpu.upload(&paged.cache).unwrap();
        let (qld, qd) = (gpu.upload(&q_lat).unwrap(), gpu.upload(&q).unwrap());
        let rows: Vec<Vec<f32>> = (0..=*positions.iter().max().unwrap())
            .map(|pp| paged.row(pp))
            .collect();
        let mut want = vec![0f32; t * heads * l];
        let mut scratch = Vec::new();
        for i in 0..t {
            for h in 0..heads {
                let qp = &q[i * heads * (p + r) + h * (p + r) + p..][..r];
                attend(
                    &lists[i],
                    |j| (&rows[j][..l], &rows[j][l..], &rows[j][..l]),
                    &q_lat[(i * heads + h) * l..][..l],
                    qp,
                    scale,
                    &mut scratch,
                    &mut want[(i * heads + h) * l..][..l],
                );
            }
        }
        let dims = AttnDims {
            t,
            heads,
            p,
            r,
            v: 0,
            l,
            scale,
        };
        let keys = KeyLists {
            n_keys: nk.ptr(),
            sel_off: so.ptr(),
            sel_pos: sp.ptr(),
        };
        // The newest query's own row (in no other query's list: the others' positions are
        // lower) NaN-poisoned in a second cache, rewritten by the kernel just before the
        // decode, as mla_q_absorb writes a step's new rows: `Early::TileButNew` must copy it
        // after its wait (the others' entries of new_slots are -1: nothing deferred).
        let newest = (0..t).max_by_key(|&i| positions[i]).unwrap();
        let new_slot = paged.slot(positions[newest]);
        let mut stale = paged.cache.clone();
        stale[new_slot * w..(new_slot + 1) * w].fill(0xffff);
        let stale = gpu.upload(&stale).unwrap();
        let new_row = gpu.upload(&rows[positions[newest]]).unwrap();
        let one_slot = gpu.upload(&[new_slot as i64]).unwrap();
        let mut new_slots = vec![-1i64; t];
        new_slots[newest] = new_slot as i64;
        let new_slots = gpu.upload(&new_slots).unwrap();
        // W64 three ways: its first key tile fetched after the PDL wait, before it, and before
        // it but for the new row; the other variants read nothing before their wait.
        let runs = MlaVariant::ALL.into_iter().flat_map(|v| {
            let all = v == MlaVariant::W64;
            [Early::No, Early::Tile, Early::TileButNew(new_slots.ptr())]
                .into_iter()
                .take(if all { 3 } else { 1 })
                .map(move |e| (v, e))
        });
        for (v, early) in runs {
            if !v.runs_on(gpu.arch) {
                continue;
            }
            let part = poisoned::<f32>(gpu, t * heads * splits * l);
            let lse = poisoned::<f32>(gpu, t * heads * splits);
            let o_lat = poisoned::<u16>(gpu, t * heads * l);
            let cache = match early {
                Early::TileButNew(_) => {
                    gpu.cache_write_bf16(1, new_row.ptr(), w, one_slot.ptr(), stale.ptr(), w)
                        .unwrap();
                    &stale
                }
                _ => &cache,
            };
            gpu.attn_mqa_tc_kernel(
                v,
                v.kernel(),
                &dims,
                qld.ptr(),
                qd.ptr(),
                cache.ptr(),
                &keys,
                tables.ptr(),
                bt_off.ptr(),
                bs,
                splits,
                part.ptr(),
                lse.ptr(),
                o_lat.ptr(),
                early,
            )
            .unwrap();
            let got: Vec<f32> = gpu
                .to_host(&o_lat)
                .unwrap()
                .iter()
                .map(|&b| unbf(b))
                .collect();
            let name = format!(
                "{v:?}{} T{t} N{heads} keys{:?} splits{splits} bs{bs}{}",
                match early {
                    Early::No => "",
                    Early::Tile => " early",
                    Early::TileButNew(_) => " early-but-new",
                },
                n_keys,
                topk.map(|k| format!(" topk{k}")).unwrap_or_default()
            );
            rep.check(
                "attn_mqa_tc",
                name,
                "bf16 cache",
                rel_err(&got, &want),
                1.0 / 128.0,
            );
        }
    }
    // Another latent width: attn_mqa_tc runs the CUDA-core kernel.
    let (t, heads, l, r, ctx, bs) = (2, 4, 64, 16, 40, 16);
    let w = l + r;
    let paged = Paged::new(rng, ctx + t, bs, w);
    let q_lat = rng.vec(t * heads * l, 1.0);
    let q = rng.vec(t * heads * (p + r), 1.0);
    let n_keys: Vec<i32> = (0..t).map(|i| (ctx + i + 1) as i32).collect();
    let d = |v: &[i32]| gpu.upload(v).unwrap();
    let (nk, so, sp, bt_off, tables) = (
        d(&n_keys),
        d(&vec![-1i32; t]),
        d(&[0]),
        d(&vec![0i32; t]),
        d(&paged.table),
    );
    let cache = gpu.upload(&paged.cache).unwrap();
    let (qld, qd) = (gpu.upload(&q_lat).unwrap(), gpu.upload(&q).unwrap());
    let (part, lse, o_lat) = (
        poisoned::<f32>(gpu, t * heads * 2 * l),
        poisoned::<f32>(gpu, t * heads * 2),
        poisoned::<u16>(gpu, t * heads * l),
    );
    let dims = AttnDims {
        t,
        heads,
        p,
        r,
        v: 0,
        l,
        scale,
    };
    let keys = KeyLists {
        n_keys: nk.ptr(),
        sel_off: so.ptr(),
        sel_pos: sp.ptr(),
    };
    gpu.attn_mqa_tc(
        &dims,
        qld.ptr(),
        qd.ptr(),
        cache.ptr(),
        &keys,
        tables.ptr(),
        bt_off.ptr(),
        bs,
        2,
        part.ptr(),
        lse.ptr(),
        o_lat.ptr(),
        Early::No,
    )
    .unwrap();
    let got: Vec<f32> = gpu
        .to_host(&o_lat)
        .unwrap()
        .iter()
        .map(|&b| unbf(b))
        .collect();
    let rows: Vec<Vec<f32>> = (0..ctx + t).map(|pp| paged.row(pp)).collect();
    let mut want = vec![0f32; t * heads * l];
    let mut scratch = Vec::new();
    for i in 0..t {
        let list: Vec<usize> = (0..n_keys[i] as usize).collect();
        for h in 0..heads {
            attend(
                &list,
                |j| (&rows[j][..l], &rows[j][l..], &rows[j][..l]),
                &q_lat[(i * heads + h) * l..][..l],
                &q[i * heads * (p + r) + h * (p + r) + p..][..r],
                scale,
                &mut scratch,
                &mut want[(i * heads + h) * l..][..l],
            );
        }
    }
    rep.check(
        "attn_mqa_tc",
        format!("fallback T{t} N{heads} L{l} R{r} ctx{ctx} splits2"),
        "bf16 cache",
        rel_err(&got, &want),
        1.0 / 256.0,
    );
}

/// GPU routing against the CPU `route` (ids exact, weights f32) for softmax/sigmoid, groups,
/// bias, norm; the expert GEMV over (token, slot) pairs and its combine against host math.
/// The fused absorbed projections (mla_absorb.cu) against the CPU: `mla_q_absorb` (q_lat =
/// W_UK_T[h] · bf16(q_nope) in f64; q_pe rotated as rope_interleaved; q_nope untouched; with
/// and without the rotation) and `mla_combine_uv` (o_lat from the LSE combine of split
/// partials, an empty split among them, rounded to bf16, then W_UV[h] · o_lat in f64; f32
/// with beta 0 and 0.5, and bf16 rows). Outputs NaN-poisoned; V2-Lite's head shape, 3 tokens.
pub(super) fn absorb(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    let (t, n, p, r, l, v) = (3usize, 4usize, 128usize, 64usize, 512usize, 128usize);
    let qk = p + r;
    let dims = AttnDims {
        t,
        heads: n,
        p,
        r,
        v,
        l,
        scale: 0.1,
    };
    let q = rng.vec(t * n * qk, 1.0);
    let w_uk = round_bf(&rng.vec(n * l * p, 0.1));
    let (cos, sin): (Vec<f32>, Vec<f32>) = (0..t * r / 2)
        .map(|i| ((i as f32 * 0.37).cos(), (i as f32 * 0.37).sin()))
        .unzip();
    let up = |x: &[f32]| {
        gpu.upload(&x.iter().map(|&v| bf(v)).collect::<Vec<_>>())
            .unwrap()
    };
    let (wd, cd, sd) = (
        up(&w_uk),
        gpu.upload(&cos).unwrap(),
        gpu.upload(&sin).unwrap(),
    );
    let mut want_lat = vec![0f32; t * n * l];
    for ti in 0..t {
        for h in 0..n {
            let qn = round_bf(&q[(ti * n + h) * qk..(ti * n + h) * qk + p]);
            for row in 0..l {
                let wr = &w_uk[(h * l + row) * p..(h * l + row + 1) * p];
                let d: f64 = wr.iter().zip(&qn).map(|(&a, &b)| a as f64 * b as f64).sum();
                want_lat[(ti * n + h) * l + row] = d as f32;
            }
        }
    }
    let mut want_q = q.clone();
    for ti in 0..t {
        for h in 0..n {
            for i in 0..r / 2 {
                let o = (ti * n + h) * qk + p + 2 * i;
                let (c, s) = (cos[ti * r / 2 + i], sin[ti * r / 2 + i]);
                let (x0, x1) = (q[o], q[o + 1]);
                want_q[o] = x0 * c - x1 * s;
                want_q[o + 1] = x0 * s + x1 * c;
            }
        }
    }
    // kv_finish fused in (with the rotation): the latent rows and the cache, against
    // kv_finish's own launch bit for bit (rows the kernels do not write stay poisoned in both).
    let lw = l + r;
    let kv0 = rng.vec(t * lw, 1.0);
    let (gamma, slots) = (rng.vec(l, 1.0), [5i64, 0, 9]);
    let (gd, sld) = (gpu.upload(&gamma).unwrap(), gpu.upload(&slots).unwrap());
    let (kv_want, cache_want) = {
        let (kvd, cached) = (gpu.upload(&kv0).unwrap(), poisoned::<u16>(gpu, 12 * lw));
        let (ks, eps) = (lw, 1e-6);
        let (c, sn) = (cd.ptr(), sd.ptr());
        gpu.kv_finish(
            t,
            kvd.ptr(),
            ks,
            gd.ptr(),
            l,
            r,
            eps,
            c,
            sn,
            sld.ptr(),
            cached.ptr(),
        )
        .unwrap();
        (gpu.to_host(&kvd).unwrap(), gpu.to_host(&cached).unwrap())
    };
    for (rope, fuse_kv) in [(true, false), (false, false), (true, true)] {
        let qd = gpu.upload(&q).unwrap();
        let lat = poisoned::<f32>(gpu, t * n * l);
        let rp = rope.then(|| (cd.ptr(), sd.ptr()));
        let (kvd, cached) = (gpu.upload(&kv0).unwrap(), poisoned::<u16>(gpu, 12 * lw));
        let kv = mlaserve_cuda::ops::KvFinish {
            kv: kvd.ptr(),
            ks: lw,
            w: gd.ptr(),
            eps: 1e-6,
            slots: sld.ptr(),
            cache: cached.ptr(),
        };
        gpu.mla_q_absorb(
            &dims,
            qd.ptr(),
            wd.ptr(),
            lat.ptr(),
            rp,
            fuse_kv.then_some(&kv),
        )
        .unwrap();
        let shape = format!("T{t} N{n} P{p} R{r} L{l} rope {rope} kv_finish {fuse_kv}");
        if fuse_kv {
            let (gk, gc) = (gpu.to_host(&kvd).unwrap(), gpu.to_host(&cached).unwrap());
            let bits = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count()
            };
            let kv_mism = bits(&gk, &kv_want);
            let c_mism = gc.iter().zip(&cache_want).filter(|(a, b)| a != b).count();
            rep.check("mla_q_absorb kv", shape.clone(), "f32", kv_mism as f64, 0.0);
            rep.check(
                "mla_q_absorb cache",
                shape.clone(),
                "bf16",
                c_mism as f64,
                0.0,
            );
        }
        let got = gpu.to_host(&lat).unwrap();
        rep.check(
            "mla_q_absorb",
            shape.clone(),
            "bf16>f32",
            rel_err(&got, &want_lat),
            1e-5,
        );
        let gq = gpu.to_host(&qd).unwrap();
        let wq = if rope { &want_q } else { &q };
        rep.check("mla_q_absorb q", shape, "f32", rel_err(&gq, wq), 1e-6);
    }
    // combine + W_UV: 5 and 16 splits (all loads at once), 20 (the general path)
    for ns in [5usize, 16, 20] {
        let part = rng.vec(t * n * ns * l, 1.0);
        let mut lse = rng.vec(t * n * ns, 3.0);
        lse[1] = f32::NEG_INFINITY; // empty splits
        lse[ns - 2] = f32::NEG_INFINITY;
        let w_uv = round_bf(&rng.vec(n * v * l, 0.1));
        let (pd, ld, wvd) = (
            gpu.upload(&part).unwrap(),
            gpu.upload(&lse).unwrap(),
            up(&w_uv),
        );
        let mut o_lat = vec![0f32; t * n * l];
        // o_lat's rounding gaps (`rounding_gap`): each output may differ from the reference by
        // sum |w| gap over its o_lat.
        let mut flip = vec![0f32; t * n * l];
        for th in 0..t * n {
            let ls = &lse[th * ns..(th + 1) * ns];
            let mx = ls.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = ls
                .iter()
                .map(|&x| {
                    if x == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (x - mx).exp()
                    }
                })
                .collect();
            let den: f32 = e.iter().sum();
            for d in 0..l {
                let x: f32 = (0..ns).map(|s| e[s] * part[(th * ns + s) * l + d]).sum();
                let y = x / den;
                o_lat[th * l + d] = unbf(bf(y));
                flip[th * l + d] = rounding_gap(y);
            }
        }
        let mut allow = vec![0f32; t * n * v];
        let mut prod = vec![0f32; t * n * v];
        for th in 0..t * n {
            let h = th % n;
            for row in 0..v {
                let wr = &w_uv[(h * v + row) * l..(h * v + row + 1) * l];
                let ol = &o_lat[th * l..(th + 1) * l];
                let d: f64 = wr.iter().zip(ol).map(|(&a, &b)| a as f64 * b as f64).sum();
                prod[th * v + row] = d as f32;
                let fl = &flip[th * l..(th + 1) * l];
                allow[th * v + row] = wr.iter().zip(fl).map(|(&a, &f)| a.abs() * f).sum();
            }
        }
        let shape = format!("T{t} N{n} splits {ns} L{l} V{v}");
        for beta in [0.0f32, 0.5] {
            let init = rng.vec(t * n * v, 1.0);
            let od = if beta == 0.0 {
                poisoned::<f32>(gpu, t * n * v)
            } else {
                gpu.upload(&init).unwrap()
            };
            gpu.mla_combine_uv(
                &dims,
                pd.ptr(),
                ld.ptr(),
                ns,
                wvd.ptr(),
                od.ptr(),
                false,
                beta,
            )
            .unwrap();
            let want: Vec<f32> = (0..t * n * v)
                .map(|i| {
                    if beta == 0.0 {
                        prod[i]
                    } else {
                        beta * init[i] + prod[i]
                    }
                })
                .collect();
            let got = within_allowance(&gpu.to_host(&od).unwrap(), &want, &allow);
            let name = format!("{shape} beta {beta}");
            rep.check(
                "mla_combine_uv",
                name,
                "bf16>f32",
                rel_err(&got, &want),
                1e-4,
            );
        }
        let ob = poisoned::<u16>(gpu, t * n * v);
        gpu.mla_combine_uv(
            &dims,
            pd.ptr(),
            ld.ptr(),
            ns,
            wvd.ptr(),
            ob.ptr(),
            true,
            0.0,
        )
        .unwrap();
        let got: Vec<f32> = gpu.to_host(&ob).unwrap().iter().map(|&b| unbf(b)).collect();
        rep.check(
            "mla_combine_uv",
            shape,
            "bf16>bf16",
            rel_err(&got, &prod),
            8e-3,
        );
    }
    // The small-split path (16 splits) against the general one (the same 16 and a 17th,
    // empty: lse -inf, which neither the max, the sum nor the partial sum changes): the same
    // bits, as mla_combine_uv's comment says.
    let ns = 16usize;
    let part = rng.vec(t * n * ns * l, 1.0);
    let lse = rng.vec(t * n * ns, 3.0);
    let w_uv = up(&round_bf(&rng.vec(n * v * l, 0.1)));
    let (mut part17, mut lse17) = (Vec::new(), Vec::new());
    for th in 0..t * n {
        part17.extend_from_slice(&part[th * ns * l..(th + 1) * ns * l]);
        part17.extend(rng.vec(l, 1.0));
        lse17.extend_from_slice(&lse[th * ns..(th + 1) * ns]);
        lse17.push(f32::NEG_INFINITY);
    }
    let mut outs = Vec::new();
    for (p_, l_, s_) in [(&part, &lse, ns), (&part17, &lse17, ns + 1)] {
        let (pd, ld) = (gpu.upload(p_).unwrap(), gpu.upload(l_).unwrap());
        let od = poisoned::<f32>(gpu, t * n * v);
        gpu.mla_combine_uv(
            &dims,
            pd.ptr(),
            ld.ptr(),
            s_,
            w_uv.ptr(),
            od.ptr(),
            false,
            0.0,
        )
        .unwrap();
        outs.push(gpu.to_host(&od).unwrap());
    }
    let bits = outs[0]
        .iter()
        .zip(&outs[1])
        .filter(|(a, b)| a.to_bits() != b.to_bits());
    let shape = format!("T{t} N{n} splits 16 vs 16 + an empty one L{l} V{v}");
    rep.check(
        "mla_combine_uv paths",
        shape,
        "f32",
        bits.count() as f64,
        0.0,
    );
}

/// The absorbed attention of a one-token-a-sequence step in one cluster launch
/// (`mla_attn_cl`) against the CPU: each token's latent row finished as kv_finish finishes it
/// (the cache against kv_finish's launch bit for bit: the new rows written, no other row
/// touched; the new rows NaN-poisoned in the cache the kernel reads), q_lat = W_UK_T ·
/// bf16(q_nope) and W_UV · bf16(o_lat) in f64, the attention by the CPU's `attend` over the
/// finished rows. Dense and DSA-selected lists, one and several 80-key chunks a block, empty
/// blocks (fewer keys than 8), V2-Lite's and GLM-5's head shapes, bf16 and f32 (beta) output.
pub(super) fn attn_cluster(gpu: &Gpu, rng: &mut Rng, rep: &mut Report) {
    use mlaserve_cuda::mla_cluster::ClusterAttn;
    use mlaserve_cuda::ops::KvFinish;
    // (heads, P, V, query positions, top-k, block size, bf16 out, beta)
    type Case = (
        usize,
        usize,
        usize,
        &'static [usize],
        Option<usize>,
        usize,
        bool,
        f32,
    );
    let cases: &[Case] = &[
        (16, 128, 128, &[512], None, 16, true, 0.0),
        (16, 128, 128, &[100, 700], None, 64, false, 0.5),
        (4, 128, 128, &[0, 5, 1300], None, 16, false, 0.0),
        (2, 192, 256, &[300], None, 16, true, 0.0),
        (4, 128, 128, &[90, 400], Some(64), 16, true, 0.0),
    ];
    let (l, r, scale, eps) = (512usize, 64usize, 0.07f32, 1e-6f32);
    let w = l + r;
    for &(heads, p, v, positions, topk, bs, out_bf16, beta) in cases {
        let t = positions.len();
        let dims = AttnDims {
            t,
            heads,
            p,
            r,
            v,
            l,
            scale,
        };
        if !gpu.mla_attn_cluster_fits(&dims) {
            println!("SKIPPED mla_attn_cl on {}: no clusters of 8", gpu.arch);
            return;
        }
        let qk = p + r;
        // One sequence a token: token i's blocks are table[bt_off[i]..], so no token's list
        // holds another's new row (the kernel's contract).
        let blocks: Vec<usize> = positions.iter().map(|&x| (x + 1).div_ceil(bs)).collect();
        let bt_offs: Vec<usize> = (0..t).map(|i| blocks[..i].iter().sum()).collect();
        let paged = Paged::new(rng, blocks.iter().sum::<usize>() * bs, bs, w);
        let slot_of = |i: usize, x: usize| paged.slot(bt_offs[i] * bs + x);
        let slots: Vec<i64> = (0..t).map(|i| slot_of(i, positions[i]) as i64).collect();
        let q = rng.vec(t * heads * qk, 1.0);
        let kv0 = rng.vec(t * w, 1.0);
        let gamma = rng.vec(l, 1.0);
        let (cos, sin): (Vec<f32>, Vec<f32>) = (0..t * r / 2)
            .map(|i| ((i as f32 * 0.29).cos(), (i as f32 * 0.29).sin()))
            .unzip();
        let w_uk = round_bf(&rng.vec(heads * l * p, 0.1));
        let w_uv = round_bf(&rng.vec(heads * v * l, 0.1));
        let up = |x: &[f32]| {
            gpu.upload(&x.iter().map(|&v| bf(v)).collect::<Vec<_>>())
                .unwrap()
        };
        let (cd, sd, gd, sld) = (
            gpu.upload(&cos).unwrap(),
            gpu.upload(&sin).unwrap(),
            gpu.upload(&gamma).unwrap(),
            gpu.upload(&slots).unwrap(),
        );
        // The cache as kv_finish leaves it (the reference rows), and the one the kernel reads:
        // the new rows poisoned.
        let cache_want = {
            let (kvd, cached) = (gpu.upload(&kv0).unwrap(), gpu.upload(&paged.cache).unwrap());
            gpu.kv_finish(
                t,
                kvd.ptr(),
                w,
                gd.ptr(),
                l,
                r,
                eps,
                cd.ptr(),
                sd.ptr(),
                sld.ptr(),
                cached.ptr(),
            )
            .unwrap();
            gpu.to_host(&cached).unwrap()
        };
        let mut stale = paged.cache.clone();
        for &sl in &slots {
            stale[sl as usize * w..(sl as usize + 1) * w].fill(0xffff);
        }
        let row = |i: usize, pos: usize| -> Vec<f32> {
            let sl = slot_of(i, pos);
            cache_want[sl * w..(sl + 1) * w]
                .iter()
                .map(|&b| unbf(b))
                .collect()
        };
        // Key lists: dense causal, or top-k of random scores (the own position not always in).
        let (sel_off, sel_pos, lists) = key_lists(rng, positions, topk);
        // The reference.
        let mut want = vec![0f32; t * heads * v];
        let mut allow = vec![0f32; t * heads * v];
        let mut scratch = Vec::new();
        let mut o_lat = vec![0f32; l];
        for i in 0..t {
            let rows: Vec<Vec<f32>> = lists[i].iter().map(|&k| row(i, k)).collect();
            let local: Vec<usize> = (0..rows.len()).collect();
            for h in 0..heads {
                let qh = &q[(i * heads + h) * qk..][..qk];
                let qn = round_bf(&qh[..p]);
                let q_lat: Vec<f32> = (0..l)
                    .map(|c| {
                        let wr = &w_uk[(h * l + c) * p..][..p];
                        wr.iter()
                            .zip(&qn)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>() as f32
                    })
                    .collect();
                let q_pe: Vec<f32> = (0..r)
                    .map(|j| {
                        let (c, s) = (cos[i * r / 2 + j / 2], sin[i * r / 2 + j / 2]);
                        let (x0, x1) = (qh[p + j / 2 * 2], qh[p + j / 2 * 2 + 1]);
                        if j % 2 == 0 {
                            x0 * c - x1 * s
                        } else {
                            x0 * s + x1 * c
                        }
                    })
                    .collect();
                attend(
                    &local,
                    |j| (&rows[j][..l], &rows[j][l..], &rows[j][..l]),
                    &q_lat,
                    &q_pe,
                    scale,
                    &mut scratch,
                    &mut o_lat,
                );
                let ob = round_bf(&o_lat);
                let gap: Vec<f32> = o_lat.iter().map(|&y| rounding_gap(y)).collect();
                for vr in 0..v {
                    let wr = &w_uv[(h * v + vr) * l..][..l];
                    let d: f64 = wr.iter().zip(&ob).map(|(&a, &b)| a as f64 * b as f64).sum();
                    want[(i * heads + h) * v + vr] = d as f32;
                    allow[(i * heads + h) * v + vr] =
                        wr.iter().zip(&gap).map(|(&a, &g)| a.abs() * g).sum();
                }
            }
        }
        let prior = rng.vec(t * heads * v, 1.0);
        if !out_bf16 {
            for (wv, &pv) in want.iter_mut().zip(&prior) {
                *wv += beta * pv;
            }
        }
        let n_keys: Vec<i32> = lists.iter().map(|k| k.len() as i32).collect();
        let d = |x: &[i32]| gpu.upload(x).unwrap();
        let (nk, so, sp) = (d(&n_keys), d(&sel_off), d(&sel_pos));
        let bt_off_i: Vec<i32> = bt_offs.iter().map(|&o| o as i32).collect();
        let (bt_off, tables) = (d(&bt_off_i), d(&paged.table));
        let cache = gpu.upload(&stale).unwrap();
        let (qd, kvd, wkd, wvd) = (
            gpu.upload(&q).unwrap(),
            gpu.upload(&kv0).unwrap(),
            up(&w_uk),
            up(&w_uv),
        );
        let kv = KvFinish {
            kv: kvd.ptr(),
            ks: w,
            w: gd.ptr(),
            eps,
            slots: sld.ptr(),
            cache: cache.ptr(),
        };
        let keys = KeyLists {
            n_keys: nk.ptr(),
            sel_off: so.ptr(),
            sel_pos: sp.ptr(),
        };
        let out_b = poisoned::<u16>(gpu, t * heads * v);
        let out_f = gpu.upload(&prior).unwrap();
        let a = ClusterAttn {
            q: qd.ptr(),
            cos: cd.ptr(),
            sin: sd.ptr(),
            kv: &kv,
            w_uk_t: wkd.ptr(),
            w_uv: wvd.ptr(),
            keys: &keys,
            block_tables: tables.ptr(),
            bt_off: bt_off.ptr(),
            block_size: bs,
            out: if out_bf16 { out_b.ptr() } else { out_f.ptr() },
            out_bf16,
            beta,
        };
        gpu.mla_attn_cluster(&dims, &a).unwrap();
        let got: Vec<f32> = match out_bf16 {
            true => gpu
                .to_host(&out_b)
                .unwrap()
                .iter()
                .map(|&b| unbf(b))
                .collect(),
            false => gpu.to_host(&out_f).unwrap(),
        };
        // o_lat's bf16 rounding may fall either way where it sits on a midpoint.
        let got = within_allowance(&got, &want, &allow);
        let shape = format!(
            "T{t} N{heads} P{p} V{v} keys{n_keys:?} bs{bs}{}{}",
            topk.map(|k| format!(" topk{k}")).unwrap_or_default(),
            if out_bf16 { " bf16" } else { " f32" }
        );
        // bf16 rows: their own rounding (2^-8 of the largest); f32: the attention's 1e-4.
        let bound = if out_bf16 { 1.0 / 256.0 } else { 1e-4 };
        rep.check(
            "mla_attn_cl",
            shape.clone(),
            "bf16 cache",
            rel_err(&got, &want),
            bound,
        );
        let gc = gpu.to_host(&cache).unwrap();
        let mism = gc.iter().zip(&cache_want).filter(|(x, y)| x != y).count();
        rep.check("mla_attn_cl cache", shape, "bf16", mism as f64, 0.0);
    }
}
