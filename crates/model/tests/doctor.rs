//! `doctor` passes on every healthy fixture file, paths and norms included.

mod common;
use common::*;
use mlaserve_model::doctor::{diagnose, Severity};

#[test]
fn doctor_passes_every_fixture() {
    for m in MODELS {
        for file in [format!("{m}-f32.gguf"), format!("{m}-bf16.gguf"), format!("{m}-q8_0.gguf"), "hf".to_string()] {
            let r = diagnose(&fixture_dir(m).join(&file), None);
            let errors: Vec<_> = r.findings.iter().filter(|f| f.severity == Severity::Error).collect();
            assert!(r.healthy, "{m}/{file}: {} {errors:?}", r.verdict);
            assert!(r.findings.iter().any(|f| f.check == "paths"), "{m}/{file}: paths not checked");
            assert!(r.findings.iter().any(|f| f.check == "norms"), "{m}/{file}: norms not checked");
        }
    }
}
