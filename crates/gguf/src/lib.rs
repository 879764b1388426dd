//! GGUF container: a validating zero-copy reader, a writer, and ggml block formats.
//!
//! [`GgufFile::open`] maps a file read-only and validates all of it up front: header
//! (versions 2 and 3, little-endian), every metadata value type including nested arrays,
//! `general.alignment`, and every tensor info (type, shape, alignment, bounds, overlap).
//! After that, tensor bytes are slices of the map ([`GgufFile::tensor_data`]) or owners of
//! it ([`GgufFile::tensor_bytes`]), and no accessor can fail on file content.
//!
//! Design decisions:
//! - Bad input is an error naming the file, the field and the byte offset
//!   ([`GgufError::Malformed`]), never a panic; every count and length is checked against
//!   the bytes left in the file before anything is allocated for it.
//! - Metadata is kept in file order (a `Vec`) with a key→index map; arrays are typed
//!   vectors ([`Array`]), so large tokenizer arrays stay compact.
//! - Dims are kept in ggml order (`ne[0]` innermost) in [`TensorInfo::dims`];
//!   [`TensorInfo::shape`] gives torch order.
//! - Split models (`*-00001-of-0000N.gguf`) are opened as one by [`GgufSplit`].

#![deny(missing_docs)]

mod error;
mod file;
#[allow(missing_docs)] // enum variants are ggml's type names; written before this crate's docs rule
pub mod ggml_type;
pub mod inspect;
pub mod metadata;
#[allow(missing_docs)] // owned by the quants module's author
pub mod quants;
mod reader;
mod split;
pub mod tensor_info;
mod writer;

pub use error::{GgufError, Problem};
pub use file::{FileData, GgufFile, TensorBytes};
pub use ggml_type::{GgmlType, QK_K};
pub use inspect::render_inspect;
pub use metadata::{Array, Value, ValueType};
pub use reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_NESTING};
pub use split::{split_path, GgufSplit, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};
pub use tensor_info::{TensorInfo, MAX_DIMS};
pub use writer::GgufWriter;
