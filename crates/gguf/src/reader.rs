//! Parsing of the GGUF header, metadata and tensor infos from a byte slice.
//!
//! Layout (little-endian, v2 and v3 alike): magic `GGUF`, u32 version, u64 tensor count,
//! u64 metadata count, the metadata (u64-length key, u32 value type, value), the tensor
//! infos (name, u32 n_dims, u64 dims, u32 ggml type, u64 offset), zero padding up to a
//! multiple of `general.alignment` (default 32), then the data section.
//!
//! Invariants: nothing is allocated for a count or length before checking that the bytes
//! left in the file can hold that many items at their smallest encoding, so a lying file
//! costs at most a small multiple of its own size in memory; array nesting is bounded by
//! [`MAX_ARRAY_NESTING`] so recursion depth is bounded; every error carries the absolute
//! offset of the field it is about. Tensors must be aligned, inside the file, and may not
//! share bytes (overlap is an error, not a warning: llama.cpp itself only accepts tensors
//! laid out back to back, so no legitimate tool writes overlapping tensors).

use std::collections::HashMap;

use crate::error::{GgufError, Problem};
use crate::ggml_type::GgmlType;
use crate::metadata::{Array, Value, ValueType};
use crate::tensor_info::{byte_size, TensorInfo, MAX_DIMS};

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// The metadata key that sets the alignment (must be a u32 power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Deepest nesting of arrays the reader accepts (an array of arrays is depth 2).
pub const MAX_ARRAY_NESTING: usize = 8;

/// Smallest encoding of one metadata pair: empty key (8), type (4), one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: empty name (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// Most items reserved up front for a declared count; larger collections grow as they are
/// actually read, so a huge (but file-size-bounded) count costs nothing until parsed.
const MAX_RESERVE: u64 = 4096;

fn reserve(count: u64) -> usize {
    count.min(MAX_RESERVE) as usize
}

/// Everything read from the front of a file.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    /// Absolute offset of the data section (may exceed the file length only when there
    /// are no tensors).
    pub data_offset: u64,
}

/// A problem at an absolute offset; the caller adds the file name and the field.
struct Fail {
    offset: u64,
    problem: Problem,
}

trait WithField<T> {
    fn field(self, file: &str, field: impl FnOnce() -> String) -> Result<T, GgufError>;
}

impl<T> WithField<T> for Result<T, Fail> {
    fn field(self, file: &str, field: impl FnOnce() -> String) -> Result<T, GgufError> {
        self.map_err(|f| GgufError::Malformed {
            file: file.to_string(),
            offset: f.offset,
            field: field(),
            problem: f.problem,
        })
    }
}

fn fail<T>(offset: usize, problem: Problem) -> Result<T, Fail> {
    Err(Fail {
        offset: offset as u64,
        problem,
    })
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], Fail> {
        if n > self.remaining() {
            let available = self.remaining();
            return fail(
                self.pos,
                Problem::Truncated {
                    needed: n,
                    available,
                },
            );
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Fail> {
        let bytes = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, Fail> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, Fail> {
        self.array().map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_each` bytes fit in the rest of the file.
    /// `at` is the offset of the count field, for the error.
    fn check_count(
        &self,
        at: usize,
        what: &'static str,
        count: u64,
        min_each: u64,
    ) -> Result<(), Fail> {
        let min_bytes = count.saturating_mul(min_each);
        if min_bytes > self.remaining() {
            return fail(
                at,
                Problem::CountTooLarge {
                    what,
                    count,
                    min_bytes,
                    available: self.remaining(),
                },
            );
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String, Fail> {
        let at = self.pos;
        let len = self.u64()?;
        self.check_count(at, "string length", len, 1)?;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => fail(
                at,
                Problem::InvalidUtf8 {
                    len,
                    valid_up_to: e.valid_up_to() as u64,
                },
            ),
        }
    }

    fn value_type(&mut self) -> Result<ValueType, Fail> {
        let at = self.pos;
        let id = self.u32()?;
        ValueType::from_id(id).map_or_else(|| fail(at, Problem::UnknownValueType(id)), Ok)
    }

    fn bool(&mut self) -> Result<bool, Fail> {
        let at = self.pos;
        match self.array::<1>()?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => fail(at, Problem::InvalidBool(b)),
        }
    }

    /// A value of type `ty`; `depth` is the array nesting of the enclosing arrays.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, Fail> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array()?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string()?),
            ValueType::Array => Value::Array(self.array_value(depth + 1)?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
        })
    }

    /// An array (element type, u64 count, elements) at nesting level `depth` (1 = outermost).
    fn array_value(&mut self, depth: usize) -> Result<Array, Fail> {
        let at = self.pos;
        if depth > MAX_ARRAY_NESTING {
            return fail(at, Problem::NestingTooDeep(MAX_ARRAY_NESTING));
        }
        let ty = self.value_type()?;
        let count_at = self.pos;
        let count = self.u64()?;
        self.check_count(count_at, "array length", count, ty.min_size() as u64)?;
        // `count` is now at most the bytes left in the file: allocations below are bounded.
        let n = count as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const SIZE: usize = std::mem::size_of::<$t>();
                let bytes = self.take((n * SIZE) as u64)?;
                Array::$variant(
                    bytes
                        .chunks_exact(SIZE)
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of SIZE bytes")))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(count)?.to_vec()),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => Array::Bool((0..n).map(|_| self.bool()).collect::<Result<_, _>>()?),
            ValueType::String => {
                Array::String((0..n).map(|_| self.string()).collect::<Result<_, _>>()?)
            }
            ValueType::Array => Array::Array(
                (0..n)
                    .map(|_| self.array_value(depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

/// Where each tensor info's fields sit, for error messages after the infos are read.
struct InfoOffsets {
    info: u64,
    offset_field: u64,
}

/// Parses and validates everything but the tensor bytes themselves.
pub(crate) fn parse(buf: &[u8], file: &str) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { buf, pos: 0 };

    // Header.
    let magic = cur.array::<4>().field(file, || "header.magic".into())?;
    if magic != GGUF_MAGIC {
        return fail(0, Problem::BadMagic { found: magic }).field(file, || "header.magic".into());
    }
    let version = cur.u32().field(file, || "header.version".into())?;
    let version_problem = match version {
        2 | 3 => None,
        v if (1..=3).contains(&v.swap_bytes()) => Some(Problem::BigEndian(v)),
        v => Some(Problem::UnsupportedVersion(v)),
    };
    if let Some(problem) = version_problem {
        return fail(4, problem).field(file, || "header.version".into());
    }
    let tensor_count_at = cur.pos;
    let tensor_count = cur.u64().field(file, || "header.tensor_count".into())?;
    let kv_count_at = cur.pos;
    let kv_count = cur
        .u64()
        .field(file, || "header.metadata_kv_count".into())?;
    cur.check_count(kv_count_at, "metadata kv count", kv_count, MIN_KV_BYTES)
        .field(file, || "header.metadata_kv_count".into())?;
    cur.check_count(
        tensor_count_at,
        "tensor count",
        tensor_count,
        MIN_TENSOR_INFO_BYTES,
    )
    .field(file, || "header.tensor_count".into())?;

    // Metadata, in file order.
    let mut metadata = Vec::with_capacity(reserve(kv_count));
    let mut key_index = HashMap::with_capacity(reserve(kv_count));
    let mut value_offsets = Vec::with_capacity(reserve(kv_count));
    for i in 0..kv_count as usize {
        let key_at = cur.pos;
        let key = cur.string().field(file, || format!("metadata[{i}] key"))?;
        let ty = cur
            .value_type()
            .field(file, || format!("metadata[{i}] {key:?} type"))?;
        value_offsets.push(cur.pos as u64);
        let value = cur
            .value(ty, 0)
            .field(file, || format!("metadata[{i}] {key:?} value"))?;
        if key_index.insert(key.clone(), i).is_some() {
            return fail(key_at, Problem::DuplicateKey(key.clone()))
                .field(file, || format!("metadata[{i}] key"));
        }
        metadata.push((key, value));
    }

    let alignment = match key_index.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let problem = match &metadata[i].1 {
                Value::U32(a) if a.is_power_of_two() => Ok(*a),
                Value::U32(0) => Err("is 0, must be a power of two > 0".to_string()),
                Value::U32(a) => Err(format!("is {a}, not a power of two")),
                v => Err(format!("has type {}, must be u32", v.type_name())),
            };
            problem
                .map_err(|msg| Fail {
                    offset: value_offsets[i],
                    problem: Problem::BadAlignment(msg),
                })
                .field(file, || format!("metadata[{i}] {ALIGNMENT_KEY:?} value"))?
        }
    } as u64;

    // Tensor infos.
    cur.check_count(
        tensor_count_at,
        "tensor count",
        tensor_count,
        MIN_TENSOR_INFO_BYTES,
    )
    .field(file, || "header.tensor_count".into())?;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(reserve(tensor_count));
    let mut tensor_index = HashMap::with_capacity(reserve(tensor_count));
    let mut offsets = Vec::with_capacity(reserve(tensor_count));
    for i in 0..tensor_count as usize {
        let info_at = cur.pos;
        let name = cur
            .string()
            .field(file, || format!("tensor_info[{i}] name"))?;
        let field = |what: &str| format!("tensor_info[{i}] {name:?} {what}");
        let n_dims_at = cur.pos;
        let n_dims = cur.u32().field(file, || field("n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return fail(n_dims_at, Problem::TooManyDims(n_dims)).field(file, || field("n_dims"));
        }
        let dims_at = cur.pos;
        let dims = (0..n_dims)
            .map(|_| cur.u64())
            .collect::<Result<Vec<_>, _>>()
            .field(file, || field("dims"))?;
        let type_at = cur.pos;
        let type_id = cur.u32().field(file, || field("type"))?;
        let ggml_type = GgmlType::from_id(type_id)
            .map_or_else(|| fail(type_at, Problem::UnknownGgmlType(type_id)), Ok)
            .field(file, || field("type"))?;
        let offset_at = cur.pos;
        let offset = cur.u64().field(file, || field("offset"))?;
        let n_bytes = byte_size(&dims, ggml_type)
            .map_err(|problem| Fail {
                offset: dims_at as u64,
                problem,
            })
            .field(file, || field("dims"))?;
        if tensor_index.insert(name.clone(), i).is_some() {
            return fail(info_at, Problem::DuplicateTensor(name.clone()))
                .field(file, || format!("tensor_info[{i}] name"));
        }
        offsets.push(InfoOffsets {
            info: info_at as u64,
            offset_field: offset_at as u64,
        });
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        });
    }

    // Data section: starts at the next multiple of the alignment.
    let data_offset = (cur.pos as u64).next_multiple_of(alignment);
    check_tensor_placement(
        &tensors,
        &offsets,
        alignment,
        data_offset,
        buf.len() as u64,
        file,
    )?;

    Ok(Parsed {
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        data_offset,
    })
}

/// Every tensor aligned, inside the file, and sharing no bytes with another.
fn check_tensor_placement(
    tensors: &[TensorInfo],
    offsets: &[InfoOffsets],
    alignment: u64,
    data_offset: u64,
    file_len: u64,
    file: &str,
) -> Result<(), GgufError> {
    let err = |i: usize, problem: Problem| GgufError::Malformed {
        file: file.to_string(),
        offset: offsets[i].offset_field,
        field: format!("tensor_info[{i}] {:?} offset", tensors[i].name),
        problem,
    };
    for (i, t) in tensors.iter().enumerate() {
        if t.offset % alignment != 0 {
            return Err(err(
                i,
                Problem::MisalignedOffset {
                    offset: t.offset,
                    alignment,
                },
            ));
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|e| e > file_len) {
            return Err(err(
                i,
                Problem::PastEnd {
                    start: data_offset.saturating_add(t.offset),
                    end: data_offset
                        .saturating_add(t.offset)
                        .saturating_add(t.n_bytes),
                    file_len,
                },
            ));
        }
    }
    // All ranges are now inside the file, so these sums cannot overflow.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].offset, offsets[i].info));
    for pair in order.windows(2) {
        let (prev, next) = (&tensors[pair[0]], &tensors[pair[1]]);
        if next.offset < prev.offset + prev.n_bytes {
            return Err(err(
                pair[1],
                Problem::Overlap {
                    start: next.offset,
                    end: next.offset + next.n_bytes,
                    other: prev.name.clone(),
                },
            ));
        }
    }
    Ok(())
}
