//! Writes a random-weight GGUF of a real model's shape, for speed benchmarks (the numbers
//! are meaningless; shapes, dtypes and routing are what matter).
//!
//!     cargo run --release -p mlaserve-model --example synth_model -- SHAPE OUT.gguf \
//!         [--layers N] [--tokenizer-from FILE.gguf] [--type bf16|q8_0|q4_k]
//!
//! SHAPE: `glm5` (GLM-5 widths: hidden 6144, 64 heads, q_lora 2048, kv_lora 512, P 192, R 64,
//! V 256, 256 experts top-8 + 1 shared, moe_intermediate 2048, DSA indexer 32 x 128 top-2048;
//! default 3 layers, the first dense) or `v2-lite` (DeepSeek-V2-Lite: hidden 2048, 27 layers,
//! 16 heads, no q_lora, kv_lora 512, P 128, R 64, V 128, 64 experts top-6 + 2 shared,
//! moe_intermediate 1408, vocab 102400), or `l512-tiny` / `l512-tiny-dsa` (hidden 256, 2
//! layers, 64 heads, kv_lora 512, R 64, P 32, V 32, 8 experts top-2 + 1 shared, vocab 1024;
//! the second GLM-5's arch with q_lora 128 and a DSA indexer 4 x 128 top-16: for checking the
//! GPU's decode kernels, written for the 512 + 64 latent row, against the CPU end to end).
//! Matrices are bf16 uniform in ±0.03, cut from one
//! random pool as large as the largest tensor (so memory stays at one tensor); norms are 1,
//! routers f32 random, correction biases 0. `--tokenizer-from` copies every `tokenizer.*` key
//! (for `serve`); without it the file has no tokenizer. `--type q8_0|q4_k` stores every
//! projection (attention, MLP, experts, output; not the embedding nor the per-head
//! attn_k_b / attn_v_b) in that GGUF block type — Q8_0 where a row is not whole Q4_K
//! super-blocks — as random quants with finite f16 scales giving values of the same size.

use mlaserve_model::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use std::borrow::Cow;

struct Shape {
    arch: &'static str,
    vocab: usize,
    hidden: usize,
    layers: usize,
    dense_layers: usize,
    inter: usize,
    heads: usize,
    q_lora: Option<usize>,
    kv_lora: usize,
    p: usize,
    r: usize,
    v: usize,
    experts: usize,
    top_k: usize,
    shared: usize,
    moe_inter: usize,
    gating: u32,
    scale: f32,
    indexer: Option<(usize, usize, usize)>,
}

fn shape(name: &str, layers: Option<usize>) -> Shape {
    match name {
        "glm5" => Shape {
            arch: "glm-dsa",
            vocab: 154_880,
            hidden: 6144,
            layers: layers.unwrap_or(3),
            dense_layers: 1,
            inter: 12_288,
            heads: 64,
            q_lora: Some(2048),
            kv_lora: 512,
            p: 192,
            r: 64,
            v: 256,
            experts: 256,
            top_k: 8,
            shared: 1,
            moe_inter: 2048,
            gating: 2,
            scale: 2.5,
            indexer: Some((32, 128, 2048)),
        },
        "v2-lite" => Shape {
            arch: "deepseek2",
            vocab: 102_400,
            hidden: 2048,
            layers: layers.unwrap_or(27),
            dense_layers: 1,
            inter: 10_944,
            heads: 16,
            q_lora: None,
            kv_lora: 512,
            p: 128,
            r: 64,
            v: 128,
            experts: 64,
            top_k: 6,
            shared: 2,
            moe_inter: 1408,
            gating: 1,
            scale: 1.0,
            indexer: None,
        },
        // Small models with the real latent row (kv_lora 512 + rope 64) and 64 heads, so that
        // the GPU's tensor-core decode kernels (written for that row) can be checked end to end
        // against the CPU: `logits --device cuda` against `--device cpu` (seconds on a CPU).
        "l512-tiny" | "l512-tiny-dsa" => {
            let dsa = name == "l512-tiny-dsa";
            Shape {
                arch: if dsa { "glm-dsa" } else { "deepseek2" },
                vocab: 1024,
                hidden: 256,
                layers: layers.unwrap_or(2),
                dense_layers: 1,
                inter: 512,
                heads: 64,
                q_lora: dsa.then_some(128),
                kv_lora: 512,
                p: 32,
                r: 64,
                v: 32,
                experts: 8,
                top_k: 2,
                shared: 1,
                moe_inter: 128,
                gating: if dsa { 2 } else { 1 },
                scale: if dsa { 2.5 } else { 1.0 },
                indexer: dsa.then_some((4, 128, 16)),
            }
        }
        other => exit(&format!(
            "unknown shape {other} (glm5, v2-lite, l512-tiny or l512-tiny-dsa)"
        )),
    }
}

fn exit(msg: &str) -> ! {
    eprintln!("synth_model: {msg}");
    std::process::exit(2)
}

fn pool(bytes: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let mut v = vec![0u8; (bytes + 2) & !1];
    v.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ((i as u64 + 1) * 0xD1B5_4A32_D192_ED03);
            for c in chunk.chunks_exact_mut(2) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let f = ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 0.03;
                c.copy_from_slice(&half::bf16::from_f32(f).to_le_bytes());
            }
        });
    v
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: synth_model glm5|v2-lite|l512-tiny|l512-tiny-dsa OUT.gguf [--layers N] \
         [--tokenizer-from FILE.gguf] [--type bf16|q8_0|q4_k]";
    let flag = |f: &str| {
        args.iter().position(|a| a == f).map(|i| {
            args.get(i + 1)
                .cloned()
                .unwrap_or_else(|| exit(&format!("{f} needs a value\n{usage}")))
        })
    };
    if args.len() < 3 {
        exit(usage);
    }
    let (name, out) = (&args[1], &args[2]);
    let wtype = match flag("--type").as_deref() {
        None | Some("bf16") => GgmlType::BF16,
        Some("q8_0") => GgmlType::Q8_0,
        Some("q4_k") => GgmlType::Q4_K,
        Some(t) => exit(&format!("--type {t}: expected bf16, q8_0 or q4_k\n{usage}")),
    };
    let layers = flag("--layers").map(|v| {
        v.parse::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .unwrap_or_else(|| exit(&format!("--layers {v}: expected a count >= 1")))
    });
    let s = shape(name, layers);
    let a = s.arch;
    let mut w = GgufWriter::new();
    let u = |x: usize| Value::U32(x as u32);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::from(a)),
        (
            "general.name".into(),
            Value::from(format!("mlaserve-synth-{name}").as_str()),
        ),
        (format!("{a}.block_count"), u(s.layers)),
        (format!("{a}.context_length"), u(65_536)),
        (format!("{a}.embedding_length"), u(s.hidden)),
        (format!("{a}.feed_forward_length"), u(s.inter)),
        (format!("{a}.attention.head_count"), u(s.heads)),
        (format!("{a}.attention.head_count_kv"), u(1)),
        (format!("{a}.rope.freq_base"), Value::F32(10_000.0)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (format!("{a}.expert_count"), u(s.experts)),
        (format!("{a}.expert_used_count"), u(s.top_k)),
        (format!("{a}.expert_group_count"), u(1)),
        (format!("{a}.expert_group_used_count"), u(1)),
        (format!("{a}.expert_gating_func"), u(s.gating as usize)),
        (format!("{a}.attention.key_length"), u(s.kv_lora + s.r)),
        (format!("{a}.attention.value_length"), u(s.kv_lora)),
        (format!("{a}.attention.key_length_mla"), u(s.p + s.r)),
        (format!("{a}.attention.value_length_mla"), u(s.v)),
        (format!("{a}.leading_dense_block_count"), u(s.dense_layers)),
        (format!("{a}.vocab_size"), u(s.vocab)),
        (format!("{a}.attention.kv_lora_rank"), u(s.kv_lora)),
        (format!("{a}.expert_feed_forward_length"), u(s.moe_inter)),
        (format!("{a}.expert_shared_count"), u(s.shared)),
        (format!("{a}.expert_weights_scale"), Value::F32(s.scale)),
        (
            format!("{a}.expert_weights_norm"),
            Value::Bool(s.gating == 2),
        ),
        (format!("{a}.rope.dimension_count"), u(s.r)),
    ];
    if let Some(q) = s.q_lora {
        kv.push((format!("{a}.attention.q_lora_rank"), u(q)));
    }
    if let Some((hi, d, topk)) = s.indexer {
        kv.push((format!("{a}.attention.indexer.head_count"), u(hi)));
        kv.push((format!("{a}.attention.indexer.key_length"), u(d)));
        kv.push((format!("{a}.attention.indexer.top_k"), u(topk)));
        kv.push((
            format!("{a}.attention.indexer.types"),
            Value::from(vec![true; s.layers]),
        ));
    }
    for (k, v) in kv {
        w.add_metadata(&k, v).unwrap();
    }
    let tok_src = flag("--tokenizer-from").map(|p| {
        GgufFile::open(&p).unwrap_or_else(|e| exit(&format!("--tokenizer-from {p}: {e}")))
    });
    if let Some(src) = &tok_src {
        use mlaserve_model::gguf::Array;
        // Padded to the model's vocabulary with unused [PADn] tokens, as llama.cpp's
        // converter pads a tokenizer smaller than the embedding.
        for (k, v) in src.metadata() {
            let v = match (k.as_str(), v) {
                ("tokenizer.ggml.tokens", Value::Array(Array::String(t))) => {
                    let mut t = t.clone();
                    let n = t.len();
                    t.extend((n..s.vocab).map(|i| format!("[PAD{i}]")));
                    Value::Array(Array::String(t))
                }
                ("tokenizer.ggml.token_type", Value::Array(Array::I32(t))) => {
                    let mut t = t.clone();
                    t.resize(s.vocab.max(t.len()), 5); // 5 = unused
                    Value::Array(Array::I32(t))
                }
                ("tokenizer.ggml.scores", Value::Array(Array::F32(t))) => {
                    let mut t = t.clone();
                    t.resize(s.vocab.max(t.len()), 0.0);
                    Value::Array(Array::F32(t))
                }
                _ => v.clone(),
            };
            if k.starts_with("tokenizer.") {
                w.add_metadata(k, v).unwrap();
            }
        }
    }
    // Tensors in torch order [out, in]; ggml dims are reversed.
    let (h, n, qk, e, fm) = (s.hidden, s.heads, s.p + s.r, s.experts, s.moe_inter);
    let mut mats: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![s.vocab, h]),
        ("output.weight".into(), vec![s.vocab, h]),
    ];
    let mut vecs: Vec<(String, usize, f32)> = vec![("output_norm.weight".into(), h, 1.0)];
    let mut f32_random: Vec<(String, Vec<usize>)> = Vec::new();
    for l in 0..s.layers {
        let b = |t: &str| format!("blk.{l}.{t}.weight");
        vecs.push((b("attn_norm"), h, 1.0));
        vecs.push((b("ffn_norm"), h, 1.0));
        vecs.push((b("attn_kv_a_norm"), s.kv_lora, 1.0));
        mats.push((b("attn_kv_a_mqa"), vec![s.kv_lora + s.r, h]));
        mats.push((b("attn_k_b"), vec![n, s.kv_lora, s.p]));
        mats.push((b("attn_v_b"), vec![n, s.v, s.kv_lora]));
        mats.push((b("attn_output"), vec![h, n * s.v]));
        match s.q_lora {
            Some(q) => {
                mats.push((b("attn_q_a"), vec![q, h]));
                vecs.push((b("attn_q_a_norm"), q, 1.0));
                mats.push((b("attn_q_b"), vec![n * qk, q]));
            }
            None => mats.push((b("attn_q"), vec![n * qk, h])),
        }
        if let (Some((hi, d, _)), Some(q)) = (s.indexer, s.q_lora) {
            vecs.push((format!("blk.{l}.indexer.k_norm.weight"), d, 1.0));
            vecs.push((format!("blk.{l}.indexer.k_norm.bias"), d, 0.0));
            f32_random.push((format!("blk.{l}.indexer.proj.weight"), vec![hi, h]));
            mats.push((format!("blk.{l}.indexer.attn_k.weight"), vec![d, h]));
            mats.push((format!("blk.{l}.indexer.attn_q_b.weight"), vec![hi * d, q]));
        }
        if l < s.dense_layers {
            mats.push((b("ffn_gate"), vec![s.inter, h]));
            mats.push((b("ffn_up"), vec![s.inter, h]));
            mats.push((b("ffn_down"), vec![h, s.inter]));
        } else {
            f32_random.push((b("ffn_gate_inp"), vec![e, h]));
            if s.gating == 2 {
                vecs.push((format!("blk.{l}.exp_probs_b.bias"), e, 0.0));
            }
            mats.push((b("ffn_gate_exps"), vec![e, fm, h]));
            mats.push((b("ffn_up_exps"), vec![e, fm, h]));
            mats.push((b("ffn_down_exps"), vec![e, h, fm]));
            mats.push((b("ffn_gate_shexp"), vec![fm * s.shared, h]));
            mats.push((b("ffn_up_shexp"), vec![fm * s.shared, h]));
            mats.push((b("ffn_down_shexp"), vec![h, fm * s.shared]));
        }
    }
    let largest = mats
        .iter()
        .map(|(_, d)| d.iter().product::<usize>())
        .max()
        .unwrap();
    let t0 = std::time::Instant::now();
    let rnd = pool(largest * 2 + (1 << 20));
    eprintln!(
        "random pool of {:.1} GB in {:.1}s",
        rnd.len() as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let dims = |d: &[usize]| d.iter().rev().map(|&x| x as u64).collect::<Vec<_>>();
    let pools: Vec<(GgmlType, Vec<u8>)> = match wtype {
        GgmlType::BF16 => Vec::new(),
        _ => [GgmlType::Q8_0, GgmlType::Q4_K]
            .into_iter()
            .map(|t| (t, quant_pool(t, &rnd)))
            .collect(),
    };
    let mut total = 0usize;
    for (i, (name, d)) in mats.iter().enumerate() {
        let n = d.iter().product::<usize>();
        let k = *d.last().unwrap();
        let keep_bf16 = wtype == GgmlType::BF16
            || name == "token_embd.weight"
            || name.contains("attn_k_b")
            || name.contains("attn_v_b");
        let ty = match wtype {
            _ if keep_bf16 => GgmlType::BF16,
            GgmlType::Q4_K if k % 256 == 0 => GgmlType::Q4_K,
            _ => GgmlType::Q8_0,
        };
        let (bv, bb) = match ty {
            GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (32, 34),
            _ => (256, 144),
        };
        let bytes = n / bv * bb;
        let src: &[u8] = match ty {
            GgmlType::BF16 => &rnd,
            _ => &pools.iter().find(|p| p.0 == ty).unwrap().1,
        };
        let off = (i * 7919 * bb) % (src.len() - bytes).max(1) / bb * bb;
        w.add_tensor(name, ty, &dims(d), Cow::Borrowed(&src[off..off + bytes]))
            .unwrap();
        total += n * 2;
    }
    for (name, len, val) in &vecs {
        let data: Vec<u8> = std::iter::repeat_n(val.to_le_bytes(), *len)
            .flatten()
            .collect();
        w.add_tensor(name, GgmlType::F32, &[*len as u64], Cow::Owned(data))
            .unwrap();
    }
    for (i, (name, d)) in f32_random.iter().enumerate() {
        let n: usize = d.iter().product();
        let data: Vec<u8> = (0..n)
            .flat_map(|j| {
                let x = ((j * 2_654_435_761 + i * 97) % 1000) as f32 / 1000.0 - 0.5;
                (x * 0.06).to_le_bytes()
            })
            .collect();
        w.add_tensor(name, GgmlType::F32, &dims(d), Cow::Owned(data))
            .unwrap();
    }
    let bytes = w
        .write_file(out)
        .unwrap_or_else(|e| exit(&format!("writing {out}: {e}")));
    eprintln!(
        "wrote {out}: {:.2} GB ({:.2} B bf16 params) in {:.1}s",
        bytes as f64 / 1e9,
        total as f64 / 2e9,
        t0.elapsed().as_secs_f64()
    );
}

/// The random pool as blocks of `ty` (whole blocks only), each block's f16 scales set to finite
/// values that give weights about the size of the bf16 ones (±0.03): Q8_0 d in [1, 2) x 1.2e-4;
/// Q4_K d in [1, 2) x 3.2e-5 and dmin = 7.5 d (mins centre the 4-bit values).
fn quant_pool(ty: GgmlType, rnd: &[u8]) -> Vec<u8> {
    let bb = if ty == GgmlType::Q8_0 { 34 } else { 144 };
    let mut p = rnd[..rnd.len() / bb * bb].to_vec();
    for blk in p.chunks_exact_mut(bb) {
        let r = 1.0 + blk[2] as f32 / 256.0;
        let (d, dmin) = if ty == GgmlType::Q8_0 {
            (r * 1.2e-4, None)
        } else {
            (r * 3.2e-5, Some(r * 2.4e-4))
        };
        blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        if let Some(m) = dmin {
            blk[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
        }
    }
    p
}
