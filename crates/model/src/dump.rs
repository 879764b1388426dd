//! `--dump DIR`: captured probe tensors as safetensors, one file per step and rank.
//!
//! File `step{STEP:06}_rank{RANK}.safetensors` holds each probe as an f32 tensor under its
//! name (`L3.mla.q_lat`), the step's token positions as `positions` (i64), and metadata
//! `path.<name>` = mha / mqa / context / -. Names match `tools/hf_dump.py`'s output so the
//! two can be compared tensor by tensor.

use crate::probe::Record;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Write the records of one or more steps, grouped by (step, rank).
pub fn write_step(dir: &Path, records: &[Record]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut groups: BTreeMap<(u64, usize), Vec<&Record>> = BTreeMap::new();
    for r in records {
        groups.entry((r.step, r.rank)).or_default().push(r);
    }
    for ((step, rank), recs) in groups {
        let mut bytes: Vec<(String, Vec<u8>, Vec<usize>, Dtype)> = Vec::new();
        let mut meta = HashMap::new();
        for r in &recs {
            let mut b = Vec::with_capacity(r.data.len() * 4);
            for x in &r.data {
                b.extend_from_slice(&x.to_le_bytes());
            }
            // A probe hit twice in one step (e.g. doctor re-running a path) keeps both.
            let mut name = r.name.clone();
            let mut k = 1;
            while bytes.iter().any(|(n, ..)| *n == name) {
                name = format!("{}#{k}", r.name);
                k += 1;
            }
            meta.insert(format!("path.{name}"), r.path.as_str().to_string());
            bytes.push((name, b, r.shape.clone(), Dtype::F32));
        }
        if let Some(r) = recs.first() {
            let mut b = Vec::new();
            for &p in &r.positions {
                b.extend_from_slice(&(p as i64).to_le_bytes());
            }
            bytes.push(("positions".into(), b, vec![r.positions.len()], Dtype::I64));
        }
        let views: Vec<(String, TensorView)> = bytes
            .iter()
            .map(|(n, b, s, d)| TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
            .collect::<Result<_, _>>()
            .map_err(|e| std::io::Error::other(format!("dump: {e}")))?;
        let out = safetensors::serialize(views, Some(meta))
            .map_err(|e| std::io::Error::other(format!("dump: {e}")))?;
        std::fs::write(
            dir.join(format!("step{step:06}_rank{rank}.safetensors")),
            out,
        )?;
    }
    Ok(())
}
