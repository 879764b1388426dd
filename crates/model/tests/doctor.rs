//! `doctor` passes on every healthy fixture file, paths and norms included.

mod common;
use common::*;
use mlaserve_model::doctor::{diagnose, Severity};

#[test]
fn doctor_passes_every_fixture() {
    for m in MODELS {
        for file in [
            format!("{m}-f32.gguf"),
            format!("{m}-bf16.gguf"),
            format!("{m}-q8_0.gguf"),
            "hf".to_string(),
        ] {
            let r = diagnose(&fixture_dir(m).join(&file), None);
            let errors: Vec<_> = r
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            assert!(r.healthy, "{m}/{file}: {} {errors:?}", r.verdict);
            assert!(
                r.findings.iter().any(|f| f.check == "paths"),
                "{m}/{file}: paths not checked"
            );
            assert!(
                r.findings.iter().any(|f| f.check == "norms"),
                "{m}/{file}: norms not checked"
            );
        }
    }
}

fn broken(file: &str) -> std::path::PathBuf {
    fixture_dir("..").join("broken").join(file)
}

/// The first error finding as (check, location).
fn first_error(r: &mlaserve_model::doctor::Report) -> (String, String) {
    let e = r
        .findings
        .iter()
        .find(|f| f.severity == Severity::Error)
        .unwrap_or_else(|| panic!("no error in {r:?}"));
    (e.check.to_string(), e.location.clone())
}

#[test]
fn doctor_names_the_yarn_multiplier_applied_twice() {
    let r = diagnose(&broken("deepseek_v3-yarn-twice.gguf"), None);
    assert!(!r.healthy);
    assert_eq!(
        first_error(&r),
        (
            "metadata".into(),
            "deepseek2.rope.scaling.yarn_log_multiplier".into()
        )
    );
}

#[test]
fn doctor_names_the_missing_expert_weights_scale() {
    let r = diagnose(&broken("deepseek_v3-no-expert-scale.gguf"), None);
    assert!(!r.healthy);
    assert_eq!(
        first_error(&r),
        ("metadata".into(), "deepseek2.expert_weights_scale".into())
    );
    assert!(r.verdict.contains("L1.moe.out"), "{}", r.verdict);
}

#[test]
fn doctor_finds_scrambled_kv_b_heads_against_the_hf_dump() {
    let r = diagnose(
        &broken("deepseek_v3-legacy-kvb-scrambled.gguf"),
        Some(&broken("deepseek_v3_reference.safetensors")),
    );
    assert!(!r.healthy);
    assert_eq!(
        first_error(&r),
        ("reference".into(), "L0.mla.attn_out".into())
    );
}

#[test]
fn doctor_finds_permuted_rope_pairs_against_the_hf_dump() {
    let r = diagnose(
        &broken("glm_moe_dsa-rope-permuted.gguf"),
        Some(&broken("glm_rope_reference.safetensors")),
    );
    assert!(!r.healthy);
    assert_eq!(first_error(&r), ("reference".into(), "L0.mla.q_pe".into()));
}

#[test]
fn doctor_agrees_with_the_hf_dump_on_healthy_files() {
    for (m, file, dump) in [
        (
            "deepseek_v3",
            "deepseek_v3-f32.gguf",
            "deepseek_v3_reference.safetensors",
        ),
        (
            "deepseek_v3",
            "deepseek_v3-legacy-f32.gguf",
            "deepseek_v3_reference.safetensors",
        ),
        (
            "glm_moe_dsa",
            "glm_moe_dsa-f32.gguf",
            "glm_rope_reference.safetensors",
        ),
    ] {
        let r = diagnose(&fixture_dir(m).join(file), Some(&broken(dump)));
        assert!(r.healthy, "{file}: {}", r.verdict);
        assert!(
            r.findings
                .iter()
                .any(|f| f.check == "reference" && f.message.contains("within")),
            "{file}"
        );
    }
}
