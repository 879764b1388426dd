//! Errors of the GGUF reader and writer.
//!
//! Invariant: every error about file content ([`GgufError::Malformed`]) names the file, the
//! field being read (e.g. `tensor_info[3] "blk.0.attn_q.weight" dims`) and the absolute byte
//! offset in the file where that field starts, so a bad file can be diagnosed with a hex dump.

use std::path::PathBuf;

use crate::ggml_type::GgmlType;

/// Any failure of this crate.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The OS refused to open, map or write a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file's bytes do not form a valid GGUF file.
    #[error("{file}: byte {offset}: {field}: {problem}")]
    Malformed {
        /// File name (the path, or the name given to `from_bytes`).
        file: String,
        /// Absolute byte offset of the offending field.
        offset: u64,
        /// The field being read, e.g. `header.version` or `metadata[4] "general.alignment"`.
        field: String,
        /// What is wrong.
        problem: Problem,
    },
    /// A metadata value exists but has a type the caller cannot use.
    #[error("{file}: metadata key {key:?} has type {found}, expected {expected}")]
    MetadataType {
        /// File name.
        file: String,
        /// The key looked up.
        key: String,
        /// What the getter accepts, e.g. "an integer".
        expected: &'static str,
        /// The type found, e.g. `f32` or `[string]`.
        found: String,
    },
    /// A metadata value has the right type but a value out of the caller's range.
    #[error("{file}: metadata key {key:?}: {message}")]
    MetadataValue {
        /// File name.
        file: String,
        /// The key looked up.
        key: String,
        /// What is wrong with the value.
        message: String,
    },
    /// The writer was asked to produce an invalid file.
    #[error("gguf writer: {0}")]
    Writer(String),
    /// A set of split files (`-00001-of-0000N.gguf`) does not fit together.
    #[error("{file}: split GGUF: {message}")]
    Split {
        /// The shard involved.
        file: String,
        /// What is wrong.
        message: String,
    },
}

/// What is wrong with a field of a malformed file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The file ends inside the field.
    #[error("file truncated: needs {needed} bytes, only {available} left")]
    Truncated {
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file from the field's offset.
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A version this reader does not read.
    #[error("unsupported GGUF version {0} (this reader reads versions 2 and 3; version 1 used 32-bit counts: re-convert the file)")]
    UnsupportedVersion(u32),
    /// The version looks byte-swapped: a big-endian GGUF v3 file.
    #[error(
        "big-endian GGUF (version field reads {0:#010x}); only little-endian files are supported"
    )]
    BigEndian(u32),
    /// A count or length that cannot fit in the rest of the file.
    #[error("{what} {count} needs at least {min_bytes} bytes, only {available} left in the file")]
    CountTooLarge {
        /// What is being counted ("string length", "array length", "tensor count", ...).
        what: &'static str,
        /// The declared count.
        count: u64,
        /// The least number of bytes that many items take (saturated at u64::MAX).
        min_bytes: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {0} (known: 0..=12)")]
    UnknownValueType(u32),
    /// A tensor type id that is not a known ggml type.
    #[error("unknown ggml type id {0}")]
    UnknownGgmlType(u32),
    /// A string that is not UTF-8.
    #[error("invalid UTF-8 in string of {len} bytes (valid up to byte {valid_up_to})")]
    InvalidUtf8 {
        /// Length of the string.
        len: u64,
        /// Bytes that are valid UTF-8 before the first bad one.
        valid_up_to: u64,
    },
    /// A bool byte other than 0 or 1.
    #[error("bool byte is {0}, expected 0 or 1")]
    InvalidBool(u8),
    /// Arrays nested deeper than the reader allows.
    #[error("arrays nested deeper than {0} levels")]
    NestingTooDeep(usize),
    /// The same metadata key twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// The same tensor name twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// `general.alignment` is unusable.
    #[error("general.alignment {0}")]
    BadAlignment(String),
    /// A tensor with more dimensions than ggml's 4.
    #[error("{0} dimensions, at most 4 are allowed")]
    TooManyDims(u32),
    /// A dimension of zero, or one that is negative as ggml's int64.
    #[error("dimension {index} is {value}{}", if *value > i64::MAX as u64 { " (negative as int64)" } else { "" })]
    BadDim {
        /// Which dimension (ggml order, 0 innermost).
        index: usize,
        /// Its value.
        value: u64,
    },
    /// The product of the dims, or the byte size, overflows.
    #[error("shape {dims:?} of {ggml_type}: {what} overflows")]
    SizeOverflow {
        /// The dims (ggml order).
        dims: Vec<u64>,
        /// The tensor type.
        ggml_type: GgmlType,
        /// "element count" or "byte size".
        what: &'static str,
    },
    /// The row length is not a whole number of blocks.
    #[error(
        "row length ne[0] = {ne0} is not a multiple of the {ggml_type} block size {block_size}"
    )]
    NotBlockMultiple {
        /// `dims[0]`.
        ne0: u64,
        /// The tensor type.
        ggml_type: GgmlType,
        /// Elements per block.
        block_size: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The offset, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor bytes that reach past the end of the file.
    #[error(
        "tensor bytes {start}..{end} (absolute) reach past the end of the file ({file_len} bytes)"
    )]
    PastEnd {
        /// Absolute start (saturated).
        start: u64,
        /// Absolute end (saturated).
        end: u64,
        /// File length.
        file_len: u64,
    },
    /// Two tensors share bytes.
    #[error("tensor bytes {start}..{end} (relative to the data section) overlap tensor {other:?}")]
    Overlap {
        /// Start, relative to the data section.
        start: u64,
        /// End, relative to the data section.
        end: u64,
        /// The tensor whose bytes it overlaps.
        other: String,
    },
}
