//! The `mlaserve` binary end to end on the fixture models: inspect, logits (.npy), trace lines,
//! dump files, doctor exit codes, generate --json.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mlaserve"))
}

fn fixture(model: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(model)
        .join(file)
}

const FILES: &[(&str, &str)] = &[
    ("deepseek_v2", "deepseek_v2-f32.gguf"),
    ("deepseek_v2", "deepseek_v2-q8_0.gguf"),
    ("deepseek_v3", "deepseek_v3-bf16.gguf"),
    ("deepseek_v3", "deepseek_v3-legacy-f32.gguf"),
    ("glm_moe_dsa", "glm_moe_dsa-q4_k_m.gguf"),
];

#[test]
fn inspect_prints_every_fixture() {
    for (m, f) in FILES {
        let out = bin().arg("inspect").arg(fixture(m, f)).output().unwrap();
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = String::from_utf8(out.stdout).unwrap();
        for needle in [
            "architecture:",
            "metadata (",
            "blk.0.attn_kv_a_mqa.weight",
            "model config:",
            "latent cache row",
            "softmax scale",
        ] {
            assert!(s.contains(needle), "{f}: missing `{needle}` in\n{s}");
        }
    }
    let legacy = String::from_utf8(
        bin()
            .arg("inspect")
            .arg(fixture("deepseek_v3", "deepseek_v3-legacy-f32.gguf"))
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(legacy.contains("legacy layout"), "{legacy}");
}

#[test]
fn inspect_rejects_a_non_gguf_file_with_a_clear_error() {
    let out = bin()
        .arg("inspect")
        .arg(fixture("deepseek_v3", "reference.json"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reference.json") && err.to_lowercase().contains("magic"),
        "{err}"
    );
}

#[test]
fn logits_writes_npy_of_tokens_by_vocab() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l.npy");
    let st = bin()
        .args([
            "logits",
            "--tokens",
            "0,5,9,13",
            "--attention-path",
            "mqa",
            "--prefill-chunk",
            "3",
            "--model",
        ])
        .arg(fixture("glm_moe_dsa", "glm_moe_dsa-f32.gguf"))
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(
        header.contains("'shape': (4, 512)") && header.contains("<f4"),
        "{header}"
    );
    assert_eq!(bytes.len(), 10 + hlen + 4 * 512 * 4);
}

#[test]
fn trace_prints_probe_lines_with_rank_path_and_shape() {
    let out = bin()
        .args([
            "--trace",
            "L0.mla.*,logits:1",
            "logits",
            "--tokens",
            "1,2,3",
            "--out",
            "/dev/null",
            "--model",
        ])
        .arg(fixture("deepseek_v3", "deepseek_v3-f32.gguf"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("[trace]")).collect();
    for (probe, shape) in [
        ("L0.mla.q_nope", "[3, 4, 32]"),
        ("L0.mla.q_pe", "[3, 4, 16]"),
        ("L0.mla.kv_c_normed", "[3, 64]"),
        ("L0.mla.k_pe", "[3, 16]"),
        ("L0.mla.attn_out", "[3, 4, 32]"),
        ("L0.mla.o_proj", "[3, 128]"),
        ("logits", "[3, 512]"),
    ] {
        let l = lines
            .iter()
            .find(|l| l.contains(&format!("probe={probe} ")))
            .unwrap_or_else(|| panic!("no {probe} in\n{err}"));
        assert!(
            l.contains("rank=0")
                && l.contains(&format!("shape={shape}"))
                && l.contains("l2=")
                && l.contains("nan=0"),
            "{l}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("probe=L0.mla.attn_out") && l.contains("path=mha")),
        "{err}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("L1.")),
        "glob leaked: {err}"
    );
}

#[test]
fn dump_writes_safetensors_per_step() {
    let dir = tempfile::tempdir().unwrap();
    let st = bin()
        .arg("--dump")
        .arg(dir.path())
        .args([
            "--dump-glob",
            "L0.*",
            "logits",
            "--tokens",
            "1,2,3",
            "--prefill-chunk",
            "2",
            "--out",
            "/dev/null",
            "--model",
        ])
        .arg(fixture("glm_moe_dsa", "glm_moe_dsa-f32.gguf"))
        .status()
        .unwrap();
    assert!(st.success());
    let mut files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].ends_with("_rank0.safetensors"));
}

#[test]
fn doctor_is_healthy_on_fixtures_and_speaks_json() {
    let out = bin()
        .args(["doctor", "--json"])
        .arg(fixture("glm_moe_dsa", "glm_moe_dsa-q8_0.gguf"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["healthy"], true);
    let out = bin()
        .arg("doctor")
        .arg(fixture("deepseek_v3", "reference.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("UNHEALTHY"));
}

#[test]
fn generate_json_is_greedy_and_reproducible() {
    let run = || {
        let out = bin()
            .args([
                "generate",
                "--tokens",
                "0,248,392",
                "--max-tokens",
                "6",
                "--ignore-eos",
                "--json",
                "--model",
            ])
            .arg(fixture("deepseek_v3", "deepseek_v3-f32.gguf"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (a, b) = (run(), run());
    assert_eq!(a["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(a, b);
}

/// The f32 values of a `.npy` written by `logits`.
fn npy_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn logits_at_tp2_and_ep_equal_tp1() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], name: &str| {
        let out = dir.path().join(name);
        let o = bin()
            .args([
                "logits",
                "--tokens",
                "0,5,9,13,20,31,7",
                "--prefill-chunk",
                "3",
            ])
            .args(extra)
            .arg("--model")
            .arg(fixture("glm_moe_dsa", "glm_moe_dsa-f32.gguf"))
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        npy_f32(&out)
    };
    let one = run(&["--tp", "1"], "tp1.npy");
    assert_eq!(one.len(), 7 * 512);
    for extra in [&["--tp", "2"][..], &["--tp", "2", "--expert-parallel"][..]] {
        let two = run(extra, "tp2.npy");
        // f32 sums regrouped over ranks: within 1e-5 of each row's largest logit.
        for (a, b) in one.chunks(512).zip(two.chunks(512)) {
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(err <= 1e-5 * scale, "{extra:?}: {err:e} vs scale {scale}");
        }
    }
}

#[test]
fn trace_at_tp2_prints_every_rank() {
    let out = bin()
        .args([
            "--trace",
            "L0.mla.o_proj,L1.out,logits:1",
            "logits",
            "--tp",
            "2",
            "--tokens",
            "1,2,3",
            "--out",
            "/dev/null",
            "--model",
        ])
        .arg(fixture("deepseek_v3", "deepseek_v3-f32.gguf"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("[trace]")).collect();
    for rank in [0, 1] {
        for probe in ["L0.mla.o_proj", "L1.out"] {
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains(&format!("rank={rank} step=0 probe={probe} "))),
                "no {probe} from rank {rank} in\n{err}"
            );
        }
    }
    // Logits are rank 0's alone.
    assert_eq!(
        lines.iter().filter(|l| l.contains("probe=logits")).count(),
        1,
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("rank=0 step=0 probe=logits")),
        "{err}"
    );
}

#[test]
fn tp_that_cannot_run_is_a_clear_error() {
    let run = |args: &[&str]| {
        let out = bin()
            .args(["logits", "--tokens", "1,2", "--out", "/dev/null"])
            .args(args)
            .arg("--model")
            .arg(fixture("deepseek_v3", "deepseek_v3-f32.gguf"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&["--tp", "3"]);
    assert!(
        err.contains("num_heads") && err.contains("tensor-parallel size 3"),
        "{err}"
    );
    if mlaserve_cuda_absent() {
        let err = run(&["--tp", "2", "--device", "cuda"]);
        assert!(err.contains("CUDA is not available"), "{err}");
    }
}

#[test]
fn dump_at_tp2_writes_one_file_per_step_and_rank() {
    let dir = tempfile::tempdir().unwrap();
    let st = bin()
        .arg("--dump")
        .arg(dir.path())
        .args([
            "--dump-glob",
            "L0.*",
            "logits",
            "--tp",
            "2",
            "--tokens",
            "1,2,3",
            "--prefill-chunk",
            "2",
            "--out",
            "/dev/null",
            "--model",
        ])
        .arg(fixture("glm_moe_dsa", "glm_moe_dsa-f32.gguf"))
        .status()
        .unwrap();
    assert!(st.success());
    let mut files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "step000000_rank0.safetensors",
            "step000000_rank1.safetensors",
            "step000001_rank0.safetensors",
            "step000001_rank1.safetensors"
        ]
    );
}

/// True on hosts without the CUDA driver (CI): `--device cuda` must then fail cleanly.
fn mlaserve_cuda_absent() -> bool {
    !std::path::Path::new("/proc/driver/nvidia").exists()
}

/// A GGUF without `tokenizer.*` keys fails `serve` with an error naming the tokenizer before
/// its weights load (a real model's load takes minutes; the error must not wait for it).
#[test]
fn serve_without_a_tokenizer_fails_before_loading() {
    use mlaserve_gguf::{GgufFile, GgufWriter};
    let src = GgufFile::open(fixture("deepseek_v2", "deepseek_v2-f32.gguf")).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if !k.starts_with("tokenizer.") {
            w.set_metadata(k, v.clone()).unwrap();
        }
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.dims, src.tensor_data(t))
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-tokenizer.gguf");
    w.write_to(std::fs::File::create(&path).unwrap()).unwrap();
    let mut child = bin()
        .args(["serve", "--port", "0", "--model"])
        .arg(&path)
        .env("MLASERVE_LOG", "info") // the 'loaded' line below is an info line
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // a server that did not fail keeps running: stop it rather than hang the test
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stderr: {err}");
    assert!(
        err.contains("tokenizer of") && err.contains("tokenizer.ggml.model"),
        "{err}"
    );
    assert!(!err.contains("loaded "), "the weights loaded first: {err}");
}
