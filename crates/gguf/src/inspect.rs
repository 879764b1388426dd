//! A human-readable dump of a GGUF file: header, every metadata pair, the tensor table.
//!
//! Long arrays and strings are summarized by [`crate::Value`]'s `Display`; shapes are in
//! torch order (outermost first), offsets relative to the data section.

use std::fmt::Write;

use crate::file::GgufFile;

/// Renders `file` as text: path, version, alignment, architecture, metadata (key, type,
/// value) and a tensor table (name, type, shape, bytes, offset).
pub fn render_inspect(file: &GgufFile) -> String {
    let mut out = String::new();
    // `write!` into a String cannot fail.
    let _ = render(file, &mut out);
    out
}

fn render(file: &GgufFile, out: &mut String) -> std::fmt::Result {
    writeln!(out, "path:          {}", file.path().display())?;
    writeln!(out, "version:       {}", file.version())?;
    writeln!(out, "alignment:     {}", file.alignment())?;
    writeln!(
        out,
        "architecture:  {}",
        file.architecture().unwrap_or("(none)")
    )?;
    writeln!(
        out,
        "file size:     {} bytes (data section at {})",
        file.file_len(),
        file.data_offset()
    )?;

    let metadata = file.metadata();
    writeln!(out, "\nmetadata ({} keys):", metadata.len())?;
    let key_w = metadata.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let types: Vec<String> = metadata.iter().map(|(_, v)| v.type_name()).collect();
    let type_w = types.iter().map(String::len).max().unwrap_or(0);
    for ((key, value), ty) in metadata.iter().zip(&types) {
        writeln!(out, "  {key:<key_w$}  {ty:<type_w$}  {value}")?;
    }

    let tensors = file.tensors();
    let total: u64 = tensors.iter().map(|t| t.n_bytes).sum();
    writeln!(out, "\ntensors ({}, {} bytes):", tensors.len(), total)?;
    let shapes: Vec<String> = tensors.iter().map(|t| format!("{:?}", t.shape())).collect();
    let name_w = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    let shape_w = shapes.iter().map(String::len).max().unwrap_or(0).max(5);
    let bytes_w = tensors
        .iter()
        .map(|t| t.n_bytes.to_string().len())
        .max()
        .unwrap_or(0)
        .max(5);
    writeln!(
        out,
        "  {:<name_w$}  {:<7}  {:<shape_w$}  {:>bytes_w$}  offset",
        "name", "type", "shape", "bytes"
    )?;
    for (t, shape) in tensors.iter().zip(&shapes) {
        writeln!(
            out,
            "  {:<name_w$}  {:<7}  {shape:<shape_w$}  {:>bytes_w$}  {}",
            t.name,
            t.ggml_type.name(),
            t.n_bytes,
            t.offset
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgmlType, GgufWriter};

    #[test]
    fn lists_metadata_and_tensors() {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", "deepseek2").unwrap();
        w.add_metadata(
            "tokenizer.ggml.tokens",
            (0..100).map(|i| i.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        w.add_tensor("token_embd.weight", GgmlType::F32, &[4, 3], vec![0u8; 48])
            .unwrap();
        let file = GgufFile::from_bytes(w.to_bytes(), "tiny.gguf").unwrap();
        let text = render_inspect(&file);
        assert!(text.contains("path:          tiny.gguf"), "{text}");
        assert!(text.contains("architecture:  deepseek2"), "{text}");
        assert!(
            text.contains(r#"[string]  [string; 100] = ["0", "1", "2", "3", …]"#),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.contains("token_embd.weight"))
            .unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols, ["token_embd.weight", "F32", "[3,", "4]", "48", "0"]);
    }
}
