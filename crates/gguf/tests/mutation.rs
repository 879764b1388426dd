//! In-process fuzzing on stable Rust: mutate valid files (bit flips, interesting integers in
//! length and count fields, truncations, splices, insertions, deletions) and require that
//! the reader never panics and that whatever it accepts is walkable and survives
//! write → read → write unchanged. The same checks as the cargo-fuzz target `read`
//! (crates/gguf/fuzz), which needs nightly.
//!
//! Deterministic (fixed seeds). `GGUF_MUTATION_ITERS=N` runs N iterations instead of the
//! default; crashes found by cargo-fuzz go into `regressions` below.

use std::panic::{catch_unwind, AssertUnwindSafe};

use mlaserve_gguf::{render_inspect, Array, GgmlType, GgufFile, GgufWriter, Value};

const DEFAULT_ITERS: u64 = 30_000;

/// splitmix64: small, fast, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "deepseek2").unwrap();
    w.add_metadata("deepseek2.attention.kv_lora_rank", 512u32)
        .unwrap();
    w.add_metadata("deepseek2.rope.freq_base", 10000f32)
        .unwrap();
    w.add_metadata("tokenizer.ggml.tokens", vec!["<s>", "</s>", "Ġa", "b"])
        .unwrap();
    w.add_metadata("tokenizer.ggml.token_type", vec![3i32, 3, 1, 1])
        .unwrap();
    w.add_metadata(
        "x.nested",
        Value::Array(Array::Array(vec![
            Array::U8(vec![1]),
            Array::Bool(vec![true]),
        ])),
    )
    .unwrap();
    w.add_metadata("x.u64", u64::MAX).unwrap();
    w.add_metadata("x.f64", 2.5f64).unwrap();
    w.add_tensor("token_embd.weight", GgmlType::F32, &[4, 2], vec![1u8; 32])
        .unwrap();
    w.add_tensor(
        "blk.0.attn_kv_a_mqa.weight",
        GgmlType::Q8_0,
        &[32, 2],
        vec![2u8; 68],
    )
    .unwrap();
    w.add_tensor(
        "blk.0.ffn_down.weight",
        GgmlType::Q4_K,
        &[256],
        vec![3u8; 144],
    )
    .unwrap();
    out.push(w.to_bytes());

    let mut w = GgufWriter::new();
    w.set_version(2).unwrap();
    w.set_alignment(8).unwrap();
    w.add_metadata("s", "short").unwrap();
    w.add_tensor("a", GgmlType::F16, &[3, 1, 1, 1], vec![4u8; 6])
        .unwrap();
    w.add_tensor("b", GgmlType::I8, &[], vec![5u8]).unwrap();
    out.push(w.to_bytes());

    out.push(include_bytes!("data/ggufpy_v3.gguf").to_vec());
    out
}

const INTERESTING_U64: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    9,
    12,
    13,
    31,
    32,
    33,
    63,
    64,
    255,
    256,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 62,
    1 << 63,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX - 31,
];

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 | 3 if len >= 8 => {
                // An interesting integer written over a (likely) length, count or id field.
                let v = INTERESTING_U64[rng.below(INTERESTING_U64.len())];
                let width = if rng.below(2) == 0 { 4 } else { 8 };
                let i = rng.below(len - width + 1);
                data[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
            4 => data.truncate(rng.below(len + 1)),
            5 if len > 0 => {
                // Splice in a chunk of another seed.
                let src = &seeds[rng.below(seeds.len())];
                let a = rng.below(src.len());
                let b = (a + 1 + rng.below(64)).min(src.len());
                let at = rng.below(len);
                data.splice(at..at, src[a..b].iter().copied());
            }
            6 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(16)).min(len);
                data.drain(a..b);
            }
            7 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(32)).min(len);
                let chunk = data[a..b].to_vec();
                let at = rng.below(len);
                data.splice(at..at, chunk);
            }
            _ => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                data.splice(at..at, (0..n).map(|_| rng.next() as u8));
            }
        }
    }
}

/// What the fuzz target checks: no panic, everything walkable, write → read → write stable.
fn exercise(data: &[u8]) -> bool {
    let Ok(file) = GgufFile::from_bytes(data, "fuzz.gguf") else {
        return false;
    };
    let _ = render_inspect(&file);
    for (key, value) in file.metadata() {
        let _ = (value.to_string(), value.type_name());
        let _ = (
            file.get_u64(key),
            file.get_i64(key),
            file.get_f32(key),
            file.get_str(key),
        );
        let _ = (
            file.get_i32_array(key),
            file.get_u32_array(key),
            file.get_f32_array(key),
        );
    }
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(t.shape().iter().product::<usize>() as u64, t.n_elements());
    }
    let rewrite = |f: &GgufFile| {
        let mut w = GgufWriter::new();
        w.set_version(f.version()).unwrap();
        for (k, v) in f.metadata() {
            w.add_metadata(k, v.clone())
                .expect("writer rejects accepted metadata");
        }
        for t in f.tensors() {
            w.add_tensor(&t.name, t.ggml_type, &t.dims, f.tensor_data(t))
                .expect("writer rejects an accepted tensor");
        }
        w.to_bytes()
    };
    let once = rewrite(&file);
    let again = GgufFile::from_bytes(&once, "rewritten.gguf").expect("rewritten file must parse");
    assert!(
        rewrite(&again) == once,
        "write → read → write is not a fixed point"
    );
    true
}

/// Inputs that once crashed or exhausted the cargo-fuzz target, kept as regressions.
#[test]
fn regressions() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fuzz");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| exercise(&data)));
        assert!(result.is_ok(), "{} panics", path.display());
        n += 1;
    }
    assert!(n >= 1, "no regression inputs found in {dir}");
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn mutated_files_never_panic() {
    let iters = std::env::var("GGUF_MUTATION_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_ITERS);
    let seeds = seeds();
    for s in &seeds {
        assert!(exercise(s), "seed must parse");
    }
    let mut rng = Rng(0x6767_7566);
    let mut accepted = 0u64;
    for i in 0..iters {
        let mut data = seeds[rng.below(seeds.len())].clone();
        mutate(&mut rng, &mut data, &seeds);
        match catch_unwind(AssertUnwindSafe(|| exercise(&data))) {
            Ok(ok) => accepted += u64::from(ok),
            Err(_) => panic!("iteration {i}: panic on input {}", hex(&data)),
        }
    }
    eprintln!("{accepted} of {iters} mutants parsed");
    // The mutations must leave some files valid, or the walk above is never exercised.
    assert!(
        accepted > iters / 50,
        "only {accepted} of {iters} mutants parsed"
    );
}
