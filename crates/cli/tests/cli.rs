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
