//! `mlaserve doctor MODEL [--reference DUMP] [--json]`: exit 0 when healthy, 1 with a verdict.

use anyhow::Result;
use mlaserve_model::doctor::{diagnose, Severity};
use std::path::Path;

pub fn run(model: &Path, reference: Option<&Path>, json: bool, verbose: bool) -> Result<bool> {
    let report = diagnose(model, reference);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("doctor: {}", report.model);
        for f in &report.findings {
            if f.severity == Severity::Info && !verbose {
                continue;
            }
            let tag = match f.severity {
                Severity::Info => "info ",
                Severity::Warning => "WARN ",
                Severity::Error => "ERROR",
            };
            println!("  {tag} [{}] {}: {}", f.check, f.location, f.message);
        }
        println!("{}", report.verdict);
    }
    Ok(report.healthy)
}
