//! [`GgufFile`]: an opened, validated GGUF file with zero-copy access to tensor bytes.
//!
//! Invariants: the whole file is validated when opened (see `reader`), so every
//! [`TensorInfo`] a `GgufFile` returns addresses bytes inside the file and
//! [`GgufFile::tensor_data`] cannot fail. The bytes live in an `Arc<FileData>` (a read-only
//! mmap, or an owned buffer for [`GgufFile::from_bytes`]) that [`TensorBytes`] keeps alive
//! beyond the borrow of the file. Tensor data is aligned in memory to
//! `min(alignment, 64)` bytes for owned buffers and to `min(alignment, page size)` for
//! maps, so `bytemuck::cast_slice` to f32/f16 works on the data of the default alignment.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::GgufError;
use crate::metadata::{Array, Value};
use crate::reader::{parse, Parsed};
use crate::tensor_info::TensorInfo;

/// 64 bytes with 64-byte alignment: the unit of owned file buffers.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

enum Backing {
    Mmap(memmap2::Mmap),
    Owned { blocks: Vec<Align64>, len: usize },
}

/// The bytes of a whole GGUF file (mapped or owned), shared through `Arc`.
pub struct FileData {
    backing: Backing,
}

impl FileData {
    fn owned(bytes: &[u8]) -> Self {
        let mut blocks = vec![Align64([0; 64]); bytes.len().div_ceil(64)];
        bytemuck::cast_slice_mut::<Align64, u8>(&mut blocks)[..bytes.len()].copy_from_slice(bytes);
        FileData {
            backing: Backing::Owned {
                blocks,
                len: bytes.len(),
            },
        }
    }
}

impl Deref for FileData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned { blocks, len } => &bytemuck::cast_slice(blocks)[..*len],
        }
    }
}

impl fmt::Debug for FileData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.backing {
            Backing::Mmap(_) => "mmap",
            Backing::Owned { .. } => "owned",
        };
        write!(f, "FileData({kind}, {} bytes)", self.len())
    }
}

/// A tensor's bytes that own a reference to the file: cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct TensorBytes {
    data: Arc<FileData>,
    range: Range<usize>,
}

impl TensorBytes {
    /// Bytes `range` (absolute file offsets) of `data`, or `None` if out of bounds.
    pub fn new(data: Arc<FileData>, range: Range<usize>) -> Option<Self> {
        (range.start <= range.end && range.end <= data.len()).then_some(TensorBytes { data, range })
    }

    /// The absolute byte range in the file.
    pub fn file_range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// A sub-range (relative to these bytes), or `None` if out of bounds.
    pub fn slice(&self, range: Range<usize>) -> Option<TensorBytes> {
        let start = self.range.start.checked_add(range.start)?;
        let end = self.range.start.checked_add(range.end)?;
        (range.start <= range.end && end <= self.range.end).then(|| TensorBytes {
            data: self.data.clone(),
            range: start..end,
        })
    }
}

impl Deref for TensorBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data[self.range.clone()]
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorBytes({:?} of {:?})", self.range, self.data)
    }
}

/// An opened GGUF file: metadata in file order, tensor infos, and the mapped bytes.
pub struct GgufFile {
    path: PathBuf,
    data: Arc<FileData>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and validates the file at `path`.
    ///
    /// The file is memory-mapped read-only; as with every mmap, it must not be modified
    /// while the `GgufFile` or any [`TensorBytes`] from it is alive.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; the documented
        // contract of `open` is that the file is not modified while mapped.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let data = FileData {
            backing: Backing::Mmap(mmap),
        };
        Self::from_data(path.to_path_buf(), Arc::new(data))
    }

    /// Validates a file held in memory; `name` stands for the path in errors and
    /// [`GgufFile::path`]. The bytes are copied once into a 64-byte-aligned buffer.
    pub fn from_bytes(bytes: impl AsRef<[u8]>, name: &str) -> Result<Self, GgufError> {
        Self::from_data(
            PathBuf::from(name),
            Arc::new(FileData::owned(bytes.as_ref())),
        )
    }

    fn from_data(path: PathBuf, data: Arc<FileData>) -> Result<Self, GgufError> {
        let Parsed {
            version,
            alignment,
            metadata,
            key_index,
            tensors,
            tensor_index,
            data_offset,
        } = parse(&data, &path.display().to_string())?;
        Ok(GgufFile {
            path,
            data,
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The path given to [`GgufFile::open`], or the name given to [`GgufFile::from_bytes`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Absolute offset of the data section (tensor offsets are relative to it). In a file
    /// without tensors it may lie past the end of the file (trailing padding is optional).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes, shared: hold it to keep the map alive.
    pub fn data_arc(&self) -> Arc<FileData> {
        self.data.clone()
    }

    /// All metadata pairs, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// `general.architecture`, when it is a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute byte range of `t` in the file.
    ///
    /// `t` should come from this file; a foreign `TensorInfo` that does not fit is clamped
    /// to an empty range at the end of the file rather than panicking.
    fn absolute_range(&self, t: &TensorInfo) -> Range<usize> {
        let len = self.data.len();
        let start = self.data_offset.saturating_add(t.offset);
        let end = start.saturating_add(t.n_bytes);
        if end > len as u64 {
            return len..len;
        }
        start as usize..end as usize
    }

    /// The tensor's bytes, borrowed from the map (zero-copy).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.data[self.absolute_range(t)]
    }

    /// The tensor's bytes as an owner of the map (zero-copy), usable after `self` is gone.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> TensorBytes {
        TensorBytes {
            data: self.data.clone(),
            range: self.absolute_range(t),
        }
    }

    fn file_name(&self) -> String {
        self.path.display().to_string()
    }

    fn type_error(&self, key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::MetadataType {
            file: self.file_name(),
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    fn value_error(&self, key: &str, message: String) -> GgufError {
        GgufError::MetadataValue {
            file: self.file_name(),
            key: key.to_string(),
            message,
        }
    }

    /// Gets `key` through `f`, which returns `None` for a value of the wrong type.
    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| self.type_error(key, expected, v)),
        }
    }

    /// An integer of any GGUF integer type in `T`'s range.
    fn integer<T: TryFrom<i128>>(&self, key: &str, range: &str) -> Result<Option<T>, GgufError> {
        let Some(x) = self.typed(key, "an integer", Value::as_integer)? else {
            return Ok(None);
        };
        T::try_from(x)
            .map(Some)
            .map_err(|_| self.value_error(key, format!("{x} is out of range for {range}")))
    }

    /// `key` as u64: any integer type is accepted; a negative value or a non-integer is an error.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.integer(key, "u64")
    }

    /// `key` as i64 (any integer type that fits).
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.integer(key, "i64")
    }

    /// `key` as u32 (any integer type that fits).
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.integer(key, "u32")
    }

    /// `key` as usize (any integer type that fits).
    pub fn get_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        self.integer(key, "usize")
    }

    /// `key` as f64: f32 or f64.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a float", Value::as_f64)
    }

    /// `key` as f32: f32, or f64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        Ok(self.get_f64(key)?.map(|x| x as f32))
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a string", Value::as_str)
    }

    /// `key` as a bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// `key` as an array of any element type.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.typed(key, "an array", Value::as_array)
    }

    /// `key` as an array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        self.typed(key, "an array of strings", |v| match v {
            Value::Array(Array::String(s)) => Some(s.as_slice()),
            _ => None,
        })
    }

    /// An integer array converted element-wise to `T`; borrowed when already `T`.
    fn int_array<'a, T: TryFrom<i64> + Clone>(
        &'a self,
        key: &str,
        expected: &'static str,
        borrow: impl FnOnce(&'a Array) -> Option<&'a [T]>,
    ) -> Result<Option<Cow<'a, [T]>>, GgufError> {
        let Some(a) = self.get_array(key)? else {
            return Ok(None);
        };
        if let Some(v) = borrow(a) {
            return Ok(Some(Cow::Borrowed(v)));
        }
        if !a.element_type().is_integer() {
            return Err(self.type_error(key, expected, self.get(key).expect("present")));
        }
        let mut out = Vec::with_capacity(a.len());
        for i in 0..a.len() {
            let x = a.get_i64(i);
            match x.and_then(|x| T::try_from(x).ok()) {
                Some(x) => out.push(x),
                None => {
                    let shown =
                        x.map_or_else(|| "a value above i64::MAX".to_string(), |x| x.to_string());
                    return Err(self.value_error(
                        key,
                        format!("element {i} is {shown}, out of range for {expected}"),
                    ));
                }
            }
        }
        Ok(Some(Cow::Owned(out)))
    }

    /// `key` as i32s: any integer array whose elements fit (tokenizer token types are
    /// declared i32, but a narrower declared type is converted, never misread).
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Cow<'_, [i32]>>, GgufError> {
        self.int_array(key, "an array of integers fitting i32", |a| match a {
            Array::I32(v) => Some(v.as_slice()),
            _ => None,
        })
    }

    /// `key` as u32s: any integer array whose elements fit.
    pub fn get_u32_array(&self, key: &str) -> Result<Option<Cow<'_, [u32]>>, GgufError> {
        self.int_array(key, "an array of integers fitting u32", |a| match a {
            Array::U32(v) => Some(v.as_slice()),
            _ => None,
        })
    }

    /// `key` as f32s: an f32 array (borrowed) or an f64 array (rounded).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Cow<'_, [f32]>>, GgufError> {
        self.typed(key, "an array of floats", |v| match v {
            Value::Array(Array::F32(v)) => Some(Cow::Borrowed(v.as_slice())),
            Value::Array(Array::F64(v)) => Some(Cow::Owned(v.iter().map(|&x| x as f32).collect())),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_types_are_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<GgufFile>();
        check::<TensorBytes>();
        check::<FileData>();
    }

    #[test]
    fn owned_data_is_64_byte_aligned() {
        let d = FileData::owned(&[1, 2, 3]);
        assert_eq!(&*d, &[1, 2, 3]);
        assert_eq!(d.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn tensor_bytes_slices_are_bounds_checked() {
        let d = Arc::new(FileData::owned(&[0, 1, 2, 3, 4, 5]));
        let t = TensorBytes::new(d.clone(), 2..5).unwrap();
        assert_eq!(&*t, &[2, 3, 4]);
        assert_eq!(&*t.slice(1..3).unwrap(), &[3, 4]);
        assert!(t.slice(1..4).is_none());
        assert!(TensorBytes::new(d, 4..7).is_none());
    }
}
