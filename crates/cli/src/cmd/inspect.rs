//! `mlaserve inspect FILE`: the container, the derived model config, and warnings.

use anyhow::Result;
use mlaserve_gguf::GgufFile;
use mlaserve_model::ModelConfig;
use std::path::Path;

pub fn run(path: &Path) -> Result<()> {
    let file = GgufFile::open(path)?;
    print!("{}", mlaserve_gguf::inspect::render_inspect(&file));
    println!("\nmodel config:");
    match ModelConfig::from_gguf(&file) {
        Ok(cfg) => {
            print!("{}", cfg.summary());
            if !cfg.warnings.is_empty() {
                println!("\nwarnings:");
                for w in &cfg.warnings {
                    println!("  - {w}");
                }
            }
        }
        Err(e) => println!("  not a runnable MLA model: {e}"),
    }
    Ok(())
}
