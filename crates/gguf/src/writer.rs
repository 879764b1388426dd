//! [`GgufWriter`]: builds GGUF files that [`crate::GgufFile`] reads back exactly.
//!
//! Invariants of a written file: little-endian GGUF v3 (or v2 on request); metadata in the
//! order added; tensors laid out back to back in the order added, each starting at a
//! multiple of the alignment and followed by zero padding up to the next multiple (as
//! llama.cpp and gguf-py write them, so llama.cpp's stricter offset check accepts the file);
//! a file without tensors ends right after its metadata (no padding: see `write_to`);
//! the alignment is `general.alignment` when present (it must be a u32 power of two),
//! else 32. Everything the reader would reject (duplicate keys or tensor names, bad shapes,
//! data of the wrong size, arrays nested too deep) is rejected when added.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::error::GgufError;
use crate::ggml_type::GgmlType;
use crate::metadata::{Array, Value};
use crate::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_NESTING};
use crate::tensor_info::byte_size;

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Cow<'a, [u8]>,
}

/// Collects metadata and tensors, then writes a GGUF file.
///
/// Tensor data is borrowed (`&'a [u8]`) or owned (`Vec<u8>`): a converter can write
/// slices of mapped files without copying them into memory first.
pub struct GgufWriter<'a> {
    version: u32,
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor<'a>>,
    tensor_names: HashSet<String>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

fn writer_err(msg: impl Into<String>) -> GgufError {
    GgufError::Writer(msg.into())
}

/// Depth of array nesting in `a` (1 for a flat array).
fn nesting(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(nesting).max().unwrap_or(0),
        _ => 1,
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty GGUF v3 file with the default alignment of 32.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            tensor_names: HashSet::new(),
        }
    }

    /// Writes `version` (2 or 3) into the header; both have the same little-endian layout.
    pub fn set_version(&mut self, version: u32) -> Result<&mut Self, GgufError> {
        if !matches!(version, 2 | 3) {
            return Err(writer_err(format!(
                "cannot write GGUF version {version}; only 2 or 3"
            )));
        }
        self.version = version;
        Ok(self)
    }

    /// Sets `general.alignment` (a power of two), adding the key if absent.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self, GgufError> {
        if !alignment.is_power_of_two() {
            return Err(writer_err(format!(
                "alignment {alignment} is not a power of two > 0"
            )));
        }
        self.set_metadata(ALIGNMENT_KEY, Value::U32(alignment))
    }

    fn check_value(key: &str, value: &Value) -> Result<(), GgufError> {
        if let Value::Array(a) = value {
            if nesting(a) > MAX_ARRAY_NESTING {
                return Err(writer_err(format!(
                    "metadata {key:?}: arrays nested deeper than {MAX_ARRAY_NESTING} levels"
                )));
            }
        }
        if key == ALIGNMENT_KEY && !matches!(value, Value::U32(a) if a.is_power_of_two()) {
            return Err(writer_err(format!(
                "{ALIGNMENT_KEY} must be a u32 power of two > 0, got {} {value}",
                value.type_name()
            )));
        }
        Ok(())
    }

    /// Appends a metadata pair; a key already present is an error.
    pub fn add_metadata(
        &mut self,
        key: &str,
        value: impl Into<Value>,
    ) -> Result<&mut Self, GgufError> {
        let value = value.into();
        Self::check_value(key, &value)?;
        if !self.keys.insert(key.to_string()) {
            return Err(writer_err(format!("duplicate metadata key {key:?}")));
        }
        self.metadata.push((key.to_string(), value));
        Ok(self)
    }

    /// Replaces the value of `key` in place, or appends the pair if absent.
    pub fn set_metadata(
        &mut self,
        key: &str,
        value: impl Into<Value>,
    ) -> Result<&mut Self, GgufError> {
        let value = value.into();
        Self::check_value(key, &value)?;
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => {
                self.keys.insert(key.to_string());
                self.metadata.push((key.to_string(), value));
            }
        }
        Ok(self)
    }

    /// Appends a tensor: `dims` in ggml order (`dims[0]` innermost), `data` exactly the
    /// tensor's byte size for `ggml_type`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self, GgufError> {
        let data = data.into();
        let n_bytes =
            byte_size(dims, ggml_type).map_err(|p| writer_err(format!("tensor {name:?}: {p}")))?;
        if data.len() as u64 != n_bytes {
            return Err(writer_err(format!(
                "tensor {name:?}: {} bytes of data, but {ggml_type} {dims:?} takes {n_bytes}",
                data.len()
            )));
        }
        if !self.tensor_names.insert(name.to_string()) {
            return Err(writer_err(format!("duplicate tensor name {name:?}")));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, Value::U32(a))) => u64::from(*a),
            _ => u64::from(DEFAULT_ALIGNMENT),
        }
    }

    /// Writes the file to `w`; returns the number of bytes written.
    ///
    /// A file without tensors ends right after its metadata: there is no data section to
    /// align, and padding it would cost up to `alignment` bytes (2 GiB for 2^31) for nothing.
    pub fn write_to(&self, mut w: impl Write) -> std::io::Result<u64> {
        let alignment = self.alignment();
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&self.version.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut head, key);
            head.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut head, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        w.write_all(&head)?;
        let mut written = head.len() as u64;
        if !self.tensors.is_empty() {
            written += write_padding(&mut w, written, alignment)?;
        }
        for t in &self.tensors {
            w.write_all(&t.data)?;
            written += t.data.len() as u64;
            written += write_padding(&mut w, t.data.len() as u64, alignment)?;
        }
        w.flush()?;
        Ok(written)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Writes the file to `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<u64, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        self.write_to(std::io::BufWriter::new(file)).map_err(io)
    }
}

/// Writes zeros from `len` up to the next multiple of `alignment`, in bounded chunks.
fn write_padding(w: &mut impl Write, len: u64, alignment: u64) -> std::io::Result<u64> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let pad = len.next_multiple_of(alignment) - len;
    let mut left = pad;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..n])?;
        left -= n as u64;
    }
    Ok(pad)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.element_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
    }
}
