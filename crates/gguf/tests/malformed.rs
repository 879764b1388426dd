//! Bad input: every malformed, truncated or lying file is an `Err` naming the file, the
//! field and the byte offset — never a panic, never an allocation the file cannot pay for.
//!
//! Files are built byte by byte with `Raw` (independent of the crate's writer, so a writer
//! bug cannot hide a reader bug), except where a valid file is the starting point.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mlaserve_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Problem, Value};

/// Tracks the largest single allocation made by the current thread.
struct MaxAlloc;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for MaxAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: MaxAlloc = MaxAlloc;

const NAME: &str = "bad.gguf";

/// A GGUF file written field by field.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u8(&mut self, x: u8) -> &mut Self {
        self.bytes(&[x])
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.bytes(&x.to_le_bytes())
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.bytes(&x.to_le_bytes())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn kv_u32(&mut self, key: &str, x: u32) -> &mut Self {
        self.str(key).u32(4).u32(x)
    }
    fn kv_str(&mut self, key: &str, s: &str) -> &mut Self {
        self.str(key).u32(8).str(s)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, alignment: usize) -> &mut Self {
        let n = self.0.len().next_multiple_of(alignment);
        self.0.resize(n, 0);
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// Parses `bytes`, which must fail without allocating more than 64 KiB at once; returns the error.
fn parse_err(bytes: &[u8]) -> GgufError {
    LARGEST.with(|m| m.set(0));
    let result = GgufFile::from_bytes(bytes, NAME);
    let largest = LARGEST.with(Cell::get);
    let err = result.expect_err("malformed file was accepted");
    let copy = bytes.len().next_multiple_of(64);
    assert!(
        largest <= copy.max(64 << 10),
        "allocated {largest} bytes for a {}-byte file",
        bytes.len()
    );
    err
}

/// Asserts a `Malformed` error at `offset` whose field contains `field` and whose message
/// contains `needle`; returns the problem.
fn expect(bytes: &[u8], offset: u64, field: &str, needle: &str) -> Problem {
    let err = parse_err(bytes);
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("{NAME}: byte {offset}: ")),
        "{msg}"
    );
    assert!(msg.contains(field), "field {field:?} not in: {msg}");
    assert!(msg.contains(needle), "{needle:?} not in: {msg}");
    match err {
        GgufError::Malformed { problem, .. } => problem,
        e => panic!("not Malformed: {e:?}"),
    }
}

/// One F32 tensor "t" of 8 elements (32 bytes), alignment 32.
fn with_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", dims, ty, offset).pad(32).zeros(data_len);
    r.0
}

/// A valid file with metadata of several types and two tensors that end exactly at EOF.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "deepseek2").unwrap();
    w.add_metadata("deepseek2.block_count", 2u32).unwrap();
    w.add_metadata("x.f", 0.5f32).unwrap();
    w.add_metadata("x.b", true).unwrap();
    w.add_metadata("x.arr", vec!["a", "bc"]).unwrap();
    w.add_metadata("x.i64s", vec![-1i64, 2]).unwrap();
    w.add_tensor("a", GgmlType::F32, &[8], vec![1u8; 32])
        .unwrap();
    w.add_tensor("b", GgmlType::Q8_0, &[32, 2], vec![2u8; 68])
        .unwrap();
    w.add_tensor("c", GgmlType::F16, &[16], vec![3u8; 32])
        .unwrap();
    w.to_bytes()
}

#[test]
fn valid_file_parses() {
    let bytes = valid_file();
    let f = GgufFile::from_bytes(&bytes, NAME).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.tensor_data(f.tensor("c").unwrap()), &[3u8; 32]);
}

#[test]
fn truncated_at_every_byte() {
    let bytes = valid_file();
    let last = GgufFile::from_bytes(&bytes, NAME).unwrap();
    let end = last.data_offset()
        + last
            .tensors()
            .iter()
            .map(|t| t.offset + t.n_bytes)
            .max()
            .unwrap();
    assert_eq!(
        end,
        bytes.len() as u64,
        "the test file must end with tensor data"
    );
    for len in 0..bytes.len() {
        let err = parse_err(&bytes[..len]);
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{NAME}: byte ")),
            "cut at {len}: {msg}"
        );
        let GgufError::Malformed {
            offset, problem, ..
        } = err
        else {
            panic!("cut at {len}: {msg}")
        };
        assert!(
            offset <= len as u64,
            "cut at {len}: offset {offset} beyond the cut"
        );
        assert!(
            matches!(
                problem,
                Problem::Truncated { .. } | Problem::CountTooLarge { .. } | Problem::PastEnd { .. }
            ),
            "cut at {len}: {msg}"
        );
    }
}

#[test]
fn trailing_padding_may_be_missing() {
    // llama.cpp's mmap loader only needs each tensor's bytes, not the final padding.
    let mut w = GgufWriter::new();
    w.add_tensor("t", GgmlType::F32, &[3], vec![7u8; 12])
        .unwrap();
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(&bytes, NAME).unwrap();
    let end = (f.data_offset() + 12) as usize;
    assert!(end < bytes.len());
    let cut = GgufFile::from_bytes(&bytes[..end], NAME).unwrap();
    assert_eq!(cut.tensor_data(cut.tensor("t").unwrap()), &[7u8; 12]);
    expect(
        &bytes[..end - 1],
        49,
        r#"tensor_info[0] "t" offset"#,
        "reach past the end of the file",
    );
}

#[test]
fn empty_file() {
    let p = expect(
        &[],
        0,
        "header.magic",
        "file truncated: needs 4 bytes, only 0 left",
    );
    assert_eq!(
        p,
        Problem::Truncated {
            needed: 4,
            available: 0
        }
    );
}

#[test]
fn bad_magic() {
    let mut bytes = Raw::header(3, 0, 0).0;
    bytes[..4].copy_from_slice(b"GGML");
    let p = expect(&bytes, 0, "header.magic", "bad magic");
    assert_eq!(p, Problem::BadMagic { found: *b"GGML" });
}

#[test]
fn version_1_is_unsupported() {
    let p = expect(
        &Raw::header(1, 0, 0).0,
        4,
        "header.version",
        "unsupported GGUF version 1",
    );
    assert_eq!(p, Problem::UnsupportedVersion(1));
}

#[test]
fn unknown_versions() {
    expect(
        &Raw::header(4, 0, 0).0,
        4,
        "header.version",
        "unsupported GGUF version 4",
    );
    expect(
        &Raw::header(0, 0, 0).0,
        4,
        "header.version",
        "unsupported GGUF version 0",
    );
    let p = expect(
        &Raw::header(3u32.swap_bytes(), 0, 0).0,
        4,
        "header.version",
        "big-endian",
    );
    assert_eq!(p, Problem::BigEndian(0x0300_0000));
}

#[test]
fn version_2_is_read() {
    let f = GgufFile::from_bytes(Raw::header(2, 0, 0).0, NAME).unwrap();
    assert_eq!(f.version(), 2);
}

#[test]
fn unknown_ggml_type() {
    // 4 was Q4_2, removed from ggml; 1000 was never a type.
    for id in [4u32, 1000] {
        let bytes = with_tensor(&[8], id, 0, 32);
        // magic 4 + version 4 + counts 16 + name 9 + n_dims 4 + dim 8 = 45.
        let p = expect(
            &bytes,
            45,
            r#"tensor_info[0] "t" type"#,
            &format!("unknown ggml type id {id}"),
        );
        assert_eq!(p, Problem::UnknownGgmlType(id));
    }
}

#[test]
fn unknown_metadata_value_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    let p = expect(
        &r.0,
        33,
        r#"metadata[0] "k" type"#,
        "unknown metadata value type 13",
    );
    assert_eq!(p, Problem::UnknownValueType(13));
    // As an array element type.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(99).u64(0);
    expect(
        &r.0,
        37,
        r#"metadata[0] "k" value"#,
        "unknown metadata value type 99",
    );
}

#[test]
fn tensor_offset_past_end() {
    let bytes = with_tensor(&[8], 0, 64, 32);
    let p = expect(
        &bytes,
        49,
        r#"tensor_info[0] "t" offset"#,
        "reach past the end of the file",
    );
    assert_eq!(
        p,
        Problem::PastEnd {
            start: 128,
            end: 160,
            file_len: 96
        }
    );
    // An offset near u64::MAX must not wrap.
    let bytes = with_tensor(&[8], 0, u64::MAX - 31, 32);
    expect(&bytes, 49, "offset", "reach past the end of the file");
}

#[test]
fn tensor_size_past_end() {
    let bytes = with_tensor(&[1024, 1024], 0, 0, 32);
    expect(
        &bytes,
        57,
        r#"tensor_info[0] "t" offset"#,
        "reach past the end of the file (128 bytes)",
    );
}

#[test]
fn misaligned_tensor_offset() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 33)
        .pad(32)
        .zeros(96);
    let p = expect(
        &r.0,
        82,
        r#"tensor_info[1] "b" offset"#,
        "not a multiple of the alignment 32",
    );
    assert_eq!(
        p,
        Problem::MisalignedOffset {
            offset: 33,
            alignment: 32
        }
    );
}

#[test]
fn string_length_2_pow_63() {
    // As a key.
    let mut r = Raw::header(3, 0, 1);
    r.u64(1 << 63).bytes(b"abc").zeros(10);
    let p = expect(
        &r.0,
        24,
        "metadata[0] key",
        "string length 9223372036854775808",
    );
    assert!(matches!(
        p,
        Problem::CountTooLarge {
            what: "string length",
            available: 13,
            ..
        }
    ));
    // As a value.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1 << 63).zeros(16);
    expect(
        &r.0,
        37,
        r#"metadata[0] "k" value"#,
        "string length 9223372036854775808 needs at least",
    );
    // As a tensor name.
    let mut r = Raw::header(3, 1, 0);
    r.u64(u64::MAX).zeros(40);
    expect(
        &r.0,
        24,
        "tensor_info[0] name",
        "string length 18446744073709551615",
    );
}

#[test]
fn array_length_2_pow_63() {
    for (elem, min) in [(0u32, 1u64), (4, 4), (8, 8), (9, 12)] {
        let mut r = Raw::header(3, 0, 1);
        r.str("tokenizer.ggml.tokens")
            .u32(9)
            .u32(elem)
            .u64(1 << 63)
            .zeros(64);
        let p = expect(
            &r.0,
            61,
            r#"metadata[0] "tokenizer.ggml.tokens" value"#,
            "array length 9223372036854775808",
        );
        let min_bytes = (1u64 << 63).saturating_mul(min);
        assert!(
            matches!(p, Problem::CountTooLarge { min_bytes: m, .. } if m == min_bytes),
            "{p:?}"
        );
    }
}

#[test]
fn absurd_tensor_count() {
    let p = expect(
        &Raw::header(3, 1_000_000_000_000, 0).0,
        8,
        "header.tensor_count",
        "tensor count 1000000000000",
    );
    assert!(matches!(p, Problem::CountTooLarge { available: 0, .. }));
    // Plausible in the header, impossible once the metadata is read.
    let mut r = Raw::header(3, 2, 1);
    r.str("a-long-key-that-eats-the-file").u32(8).str("v");
    expect(
        &r.0,
        8,
        "header.tensor_count",
        "tensor count 2 needs at least 48 bytes, only 0 left",
    );
}

#[test]
fn absurd_kv_count() {
    let p = expect(
        &Raw::header(3, 0, 1_000_000_000_000).0,
        16,
        "header.metadata_kv_count",
        "metadata kv count 1000000000000",
    );
    assert!(matches!(p, Problem::CountTooLarge { .. }));
}

#[test]
fn dims_product_overflows() {
    // Element count wraps u64 (llama.cpp #18674).
    let bytes = with_tensor(&[1 << 32, 1 << 32, 16], 0, 0, 32);
    let p = expect(
        &bytes,
        37,
        r#"tensor_info[0] "t" dims"#,
        "element count overflows",
    );
    assert!(matches!(
        p,
        Problem::SizeOverflow {
            what: "element count",
            ..
        }
    ));
    // Above i64::MAX without wrapping (llama.cpp #27203: ne = (INT64_MAX, 2) of I8).
    let bytes = with_tensor(&[i64::MAX as u64, 2], GgmlType::I8.id(), 0, 32);
    expect(&bytes, 37, "dims", "element count overflows");
    // Element count fits, byte size wraps.
    let bytes = with_tensor(&[1 << 31, 1 << 31], GgmlType::F64.id(), 0, 32);
    let p = expect(&bytes, 37, "dims", "byte size overflows");
    assert!(matches!(
        p,
        Problem::SizeOverflow {
            what: "byte size",
            ..
        }
    ));
}

#[test]
fn byte_size_that_wraps_after_padding() {
    // llama.cpp #26978: 2^64 - 16 bytes, which wraps to 0 when padded to 32.
    let bytes = with_tensor(&[4, (1 << 30) - 1, (1 << 30) + 1, 1], 0, 0, 32);
    let p = expect(
        &bytes,
        73,
        r#"tensor_info[0] "t" offset"#,
        "reach past the end of the file",
    );
    assert!(matches!(p, Problem::PastEnd { end: u64::MAX, .. }), "{p:?}");
}

#[test]
fn too_many_dims() {
    let bytes = with_tensor(&[1, 1, 1, 1, 8], 0, 0, 32);
    let p = expect(
        &bytes,
        33,
        r#"tensor_info[0] "t" n_dims"#,
        "5 dimensions, at most 4",
    );
    assert_eq!(p, Problem::TooManyDims(5));
    // A huge n_dims must not be used to size anything.
    let mut r = Raw::header(3, 1, 0);
    r.str("t").u32(u32::MAX).zeros(64);
    expect(&r.0, 33, "n_dims", "4294967295 dimensions");
}

#[test]
fn zero_dim() {
    let bytes = with_tensor(&[8, 0], 0, 0, 32);
    let p = expect(&bytes, 37, r#"tensor_info[0] "t" dims"#, "dimension 1 is 0");
    assert_eq!(p, Problem::BadDim { index: 1, value: 0 });
}

#[test]
fn negative_looking_dim() {
    let bytes = with_tensor(&[8, (-2i64) as u64], 0, 0, 32);
    expect(
        &bytes,
        37,
        "dims",
        "dimension 1 is 18446744073709551614 (negative as int64)",
    );
}

#[test]
fn row_not_a_multiple_of_the_block_size() {
    // 64 elements of Q8_0 (2 blocks) but as rows of 16.
    let bytes = with_tensor(&[16, 4], GgmlType::Q8_0.id(), 0, 68);
    let p = expect(
        &bytes,
        37,
        "dims",
        "ne[0] = 16 is not a multiple of the Q8_0 block size 32",
    );
    assert!(matches!(
        p,
        Problem::NotBlockMultiple {
            ne0: 16,
            block_size: 32,
            ..
        }
    ));
}

#[test]
fn alignment_of_the_wrong_type() {
    for (ty, value, found) in [
        (5u32, 32u64, "i32"),
        (10, 32, "u64"),
        (6, 0x4200_0000, "f32"),
    ] {
        let mut r = Raw::header(3, 0, 1);
        r.str("general.alignment").u32(ty);
        if ty == 10 {
            r.u64(value);
        } else {
            r.u32(value as u32);
        }
        let p = expect(
            &r.0,
            53,
            r#"metadata[0] "general.alignment" value"#,
            &format!("has type {found}, must be u32"),
        );
        assert!(matches!(p, Problem::BadAlignment(_)));
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    expect(
        &r.0,
        53,
        "general.alignment",
        "has type string, must be u32",
    );
}

#[test]
fn alignment_zero() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 0);
    expect(
        &r.0,
        53,
        "general.alignment",
        "is 0, must be a power of two > 0",
    );
}

#[test]
fn alignment_not_a_power_of_two() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 48);
    expect(&r.0, 53, "general.alignment", "is 48, not a power of two");
}

#[test]
fn alignment_that_overflows_padding() {
    // llama.cpp #26318 / huggingface.js #2201: 2^31 padding. Our arithmetic is u64 and
    // checked, so this is only a data section that starts far past the end of the file.
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 1 << 31)
        .tensor("t", &[8], 0, 0)
        .pad(32)
        .zeros(32);
    let p = expect(
        &r.0,
        82,
        r#"tensor_info[0] "t" offset"#,
        "reach past the end of the file",
    );
    assert_eq!(
        p,
        Problem::PastEnd {
            start: 1 << 31,
            end: (1 << 31) + 32,
            file_len: 128
        }
    );
    // Without tensors the (empty) data section may lie beyond the end.
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 1 << 31);
    let f = GgufFile::from_bytes(&r.0, NAME).unwrap();
    assert_eq!(f.alignment(), 1 << 31);
    assert!(f.tensors().is_empty());
}

#[test]
fn duplicate_tensor_names() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0)
        .tensor("t", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    let p = expect(
        &r.0,
        57,
        "tensor_info[1] name",
        r#"duplicate tensor name "t""#,
    );
    assert_eq!(p, Problem::DuplicateTensor("t".into()));
}

#[test]
fn duplicate_keys() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_str("general.name", "a").kv_str("general.name", "b");
    let p = expect(
        &r.0,
        57,
        "metadata[1] key",
        r#"duplicate metadata key "general.name""#,
    );
    assert_eq!(p, Problem::DuplicateKey("general.name".into()));
}

#[test]
fn invalid_utf8() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(3).bytes(b"a\xffb").u32(4).u32(0);
    let p = expect(
        &r.0,
        24,
        "metadata[0] key",
        "invalid UTF-8 in string of 3 bytes (valid up to byte 1)",
    );
    assert_eq!(
        p,
        Problem::InvalidUtf8 {
            len: 3,
            valid_up_to: 1
        }
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("ok")
        .u64(2)
        .bytes(b"\xc3(");
    expect(
        &r.0,
        79,
        r#"metadata[0] "tokenizer.ggml.tokens" value"#,
        "invalid UTF-8",
    );
    let mut r = Raw::header(3, 1, 0);
    r.u64(1)
        .bytes(b"\x80")
        .u32(1)
        .u64(8)
        .u32(0)
        .u64(0)
        .pad(32)
        .zeros(32);
    expect(&r.0, 24, "tensor_info[0] name", "invalid UTF-8");
}

#[test]
fn invalid_bool() {
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(7).u8(2);
    let p = expect(
        &r.0,
        37,
        r#"metadata[0] "b" value"#,
        "bool byte is 2, expected 0 or 1",
    );
    assert_eq!(p, Problem::InvalidBool(2));
}

#[test]
fn arrays_nested_too_deep() {
    let mut r = Raw::header(3, 0, 1);
    r.str("n").u32(9);
    for _ in 0..1000 {
        r.u32(9).u64(1);
    }
    let p = expect(
        &r.0,
        37 + 8 * 12,
        r#"metadata[0] "n" value"#,
        "nested deeper than 8",
    );
    assert_eq!(p, Problem::NestingTooDeep(8));
}

#[test]
fn overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    let p = expect(
        &r.0,
        82,
        r#"tensor_info[1] "b" offset"#,
        r#"bytes 32..64 (relative to the data section) overlap tensor "a""#,
    );
    assert_eq!(
        p,
        Problem::Overlap {
            start: 32,
            end: 64,
            other: "a".into()
        }
    );
}

#[test]
fn narrower_tokenizer_array_is_converted_not_misread() {
    // llama.cpp #26690: token types declared as u8 where i32 is expected.
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.token_type", vec![1u8, 3, 6])
        .unwrap();
    w.add_metadata("tokenizer.ggml.scores", vec![1u64 << 40])
        .unwrap();
    w.add_metadata("tokenizer.ggml.tokens", vec![0.5f32])
        .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes(), NAME).unwrap();
    assert_eq!(
        &*f.get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap(),
        &[1, 3, 6]
    );
    let e = f
        .get_i32_array("tokenizer.ggml.scores")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("element 0 is 1099511627776, out of range"),
        "{e}"
    );
    let e = f
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        r#"bad.gguf: metadata key "tokenizer.ggml.tokens" has type [f32], expected an array of strings"#
    );
}

#[test]
fn getters_name_key_and_type() {
    let mut w = GgufWriter::new();
    w.add_metadata("a.str", "x").unwrap();
    w.add_metadata("a.neg", -1i32).unwrap();
    w.add_metadata("a.big", u64::MAX).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes(), NAME).unwrap();
    let e = f.get_u64("a.str").unwrap_err().to_string();
    assert_eq!(
        e,
        r#"bad.gguf: metadata key "a.str" has type string, expected an integer"#
    );
    let e = f.get_u64("a.neg").unwrap_err().to_string();
    assert_eq!(
        e,
        r#"bad.gguf: metadata key "a.neg": -1 is out of range for u64"#
    );
    assert!(f.get_i64("a.big").is_err());
    assert_eq!(f.get_u64("a.big").unwrap(), Some(u64::MAX));
    assert_eq!(f.get_u64("missing").unwrap(), None);
    assert!(matches!(f.get("a.neg"), Some(Value::I32(-1))));
}

#[test]
fn plausible_counts_are_not_reserved_up_front() {
    // 10^6 pairs fit in these 13 MB (13 bytes each), but the file holds only two before a
    // duplicate key: memory for a million pairs must not be reserved before reading them.
    let mut r = Raw::header(3, 0, 1_000_000);
    r.zeros(13_000_000);
    let p = expect(&r.0, 37, "metadata[1] key", r#"duplicate metadata key """#);
    assert_eq!(p, Problem::DuplicateKey(String::new()));
}
