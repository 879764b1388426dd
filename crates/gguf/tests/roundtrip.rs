//! Writer → reader round trips: every value type (nested arrays too), several ggml types,
//! alignments and versions, through memory and through a mapped file; and what the writer
//! refuses to write.

use mlaserve_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Value, ValueType};
use proptest::prelude::*;

/// Deterministic bytes for tensor data.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn every_value_type() -> Vec<(String, Value)> {
    let nested = Array::Array(vec![
        Array::U8(vec![1, 2]),
        Array::String(vec!["x".into()]),
        Array::Array(vec![Array::F64(vec![0.25]), Array::Bool(vec![])]),
        Array::I16(vec![]),
    ]);
    let kvs: Vec<(&str, Value)> = vec![
        ("general.architecture", "glm-dsa".into()),
        ("v.u8", Value::U8(255)),
        ("v.i8", Value::I8(-128)),
        ("v.u16", Value::U16(65535)),
        ("v.i16", Value::I16(-32768)),
        ("v.u32", Value::U32(u32::MAX)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.f32", Value::F32(-1.5e-30)),
        ("v.bool", Value::Bool(true)),
        ("v.string", "ünïcödé — 中文 🦀".into()),
        ("v.empty_string", "".into()),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(f64::MAX)),
        ("a.u8", vec![0u8, 7, 255].into()),
        ("a.i8", vec![-1i8, 1].into()),
        ("a.u16", vec![1u16, 65535].into()),
        ("a.i16", vec![-2i16].into()),
        ("a.u32", vec![3u32; 17].into()),
        ("a.i32", vec![-4i32, 4].into()),
        ("a.f32", vec![0.5f32, f32::INFINITY].into()),
        ("a.bool", vec![true, false, true].into()),
        ("a.string", vec!["<s>", "", "Ġthe"].into()),
        ("a.u64", vec![u64::MAX].into()),
        ("a.i64", vec![i64::MIN, 0].into()),
        ("a.f64", vec![-0.125f64].into()),
        ("a.empty_f32", Vec::<f32>::new().into()),
        ("a.empty_string", Vec::<String>::new().into()),
        ("a.nested", Value::Array(nested)),
        ("a.empty_nested", Value::Array(Array::Array(vec![]))),
    ];
    kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// (name, type, dims in ggml order): odd sizes so padding is exercised.
const TENSORS: &[(&str, GgmlType, &[u64])] = &[
    ("token_embd.weight", GgmlType::F32, &[8, 3]),
    ("blk.0.attn_norm.weight", GgmlType::F16, &[5]),
    ("blk.0.attn_q.weight", GgmlType::BF16, &[7, 2, 1]),
    ("blk.0.attn_kv_a_mqa.weight", GgmlType::Q8_0, &[64, 3]),
    ("blk.0.ffn_down.weight", GgmlType::Q4_K, &[256, 2]),
    ("blk.0.ffn_up.weight", GgmlType::Q6_K, &[256, 1, 1, 2]),
    ("blk.0.ffn_gate_exps.weight", GgmlType::MXFP4, &[32, 3, 2]),
    ("blk.0.attn_k_b.weight", GgmlType::IQ4_XS, &[256]),
    ("blk.0.i8", GgmlType::I8, &[3]),
    ("scalar", GgmlType::F64, &[]),
];

fn build(alignment: Option<u32>, version: u32) -> (GgufWriter<'static>, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    w.set_version(version).unwrap();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in every_value_type() {
        w.add_metadata(&k, v).unwrap();
    }
    let mut datas = Vec::new();
    for (i, &(name, ty, dims)) in TENSORS.iter().enumerate() {
        let n: u64 = dims.iter().product();
        let bytes = pattern(ty.row_bytes(n).unwrap() as usize, i as u8);
        w.add_tensor(name, ty, dims, bytes.clone()).unwrap();
        datas.push(bytes);
    }
    (w, datas)
}

fn check(file: &GgufFile, datas: &[Vec<u8>], alignment: u64, version: u32) {
    assert_eq!(file.version(), version);
    assert_eq!(file.alignment(), alignment);
    assert_eq!(file.architecture(), Some("glm-dsa"));
    let mut expected = every_value_type();
    if alignment != 32 {
        expected.insert(
            0,
            ("general.alignment".into(), Value::U32(alignment as u32)),
        );
    }
    assert_eq!(file.metadata(), expected.as_slice());
    assert_eq!(file.tensors().len(), TENSORS.len());
    for (t, (&(name, ty, dims), data)) in file.tensors().iter().zip(TENSORS.iter().zip(datas)) {
        assert_eq!(
            (t.name.as_str(), t.ggml_type, t.dims.as_slice()),
            (name, ty, dims)
        );
        assert_eq!(t.offset % alignment, 0);
        assert_eq!(file.tensor(name), Some(t));
        assert_eq!(file.tensor_data(t), data.as_slice(), "{name}");
        assert_eq!(&*file.tensor_bytes(t), data.as_slice(), "{name}");
        // Memory alignment: 64 for owned buffers, page size for maps.
        let addr = file.tensor_data(t).as_ptr() as usize;
        assert_eq!(addr % alignment.min(64) as usize, 0, "{name} at {addr:#x}");
    }
    let shape = file.tensor("blk.0.ffn_up.weight").unwrap().shape();
    assert_eq!(shape, vec![2, 1, 1, 256]);
    assert_eq!(file.tensor("scalar").unwrap().shape(), Vec::<usize>::new());
}

#[test]
fn every_value_and_tensor_type_round_trips_in_memory() {
    for (alignment, version) in [(None, 3), (Some(1), 3), (Some(64), 2), (Some(4096), 3)] {
        let (w, datas) = build(alignment, version);
        let bytes = w.to_bytes();
        let file = GgufFile::from_bytes(&bytes, "mem.gguf").unwrap();
        check(&file, &datas, alignment.unwrap_or(32) as u64, version);

        // Rewriting what was read gives the same bytes (this also covers float bit patterns).
        let mut again = GgufWriter::new();
        again.set_version(version).unwrap();
        for (k, v) in file.metadata() {
            again.add_metadata(k, v.clone()).unwrap();
        }
        for t in file.tensors() {
            again
                .add_tensor(&t.name, t.ggml_type, &t.dims, file.tensor_data(t))
                .unwrap();
        }
        assert!(
            again.to_bytes() == bytes,
            "rewrite differs (alignment {alignment:?})"
        );
    }
}

#[test]
fn round_trips_through_a_mapped_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let (w, datas) = build(None, 3);
    let written = w.write_file(&path).unwrap();
    assert_eq!(written, std::fs::metadata(&path).unwrap().len());
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.path(), path);
    check(&file, &datas, 32, 3);

    // Tensor bytes keep the map alive after the file is dropped.
    let t = file.tensor("blk.0.ffn_down.weight").unwrap().clone();
    let bytes = file.tensor_bytes(&t);
    let whole = file.data_arc();
    drop(file);
    assert_eq!(&*bytes, datas[4].as_slice());
    assert_eq!(bytes.len() as u64, t.n_bytes);
    assert_eq!(&whole[bytes.file_range()], datas[4].as_slice());
}

#[test]
fn nan_bits_survive() {
    let nan = f32::from_bits(0x7fc0_1234);
    let mut w = GgufWriter::new();
    w.add_metadata("nan", nan).unwrap();
    w.add_metadata("nans", vec![f64::from_bits(0xfff8_0000_0000_0001)])
        .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes(), "nan.gguf").unwrap();
    assert!(matches!(f.get("nan"), Some(Value::F32(x)) if x.to_bits() == 0x7fc0_1234));
    let Some(Value::Array(Array::F64(v))) = f.get("nans") else {
        panic!()
    };
    assert_eq!(v[0].to_bits(), 0xfff8_0000_0000_0001);
}

#[test]
fn typed_getters() {
    let (w, _) = build(None, 3);
    let f = GgufFile::from_bytes(w.to_bytes(), "g.gguf").unwrap();
    assert_eq!(f.get_u64("v.u8").unwrap(), Some(255));
    assert_eq!(f.get_i64("v.i32").unwrap(), Some(i32::MIN as i64));
    assert_eq!(f.get_u32("v.u16").unwrap(), Some(65535));
    assert!(f.get_u32("v.u64").is_err());
    assert_eq!(f.get_f32("v.f32").unwrap(), Some(-1.5e-30));
    assert_eq!(f.get_f64("v.f64").unwrap(), Some(f64::MAX));
    assert_eq!(f.get_bool("v.bool").unwrap(), Some(true));
    assert_eq!(f.get_str("v.string").unwrap(), Some("ünïcödé — 中文 🦀"));
    assert_eq!(
        f.get_str_array("a.string").unwrap().unwrap(),
        ["<s>", "", "Ġthe"]
    );
    assert_eq!(&*f.get_i32_array("a.i32").unwrap().unwrap(), &[-4, 4]);
    assert_eq!(&*f.get_i32_array("a.u8").unwrap().unwrap(), &[0, 7, 255]);
    assert_eq!(&*f.get_u32_array("a.u16").unwrap().unwrap(), &[1, 65535]);
    assert!(f.get_u32_array("a.i8").is_err());
    assert_eq!(&*f.get_f32_array("a.f64").unwrap().unwrap(), &[-0.125]);
    assert_eq!(
        f.get_array("a.nested").unwrap().unwrap().element_type(),
        ValueType::Array
    );
    assert!(f.get_f32("v.string").is_err());
    assert!(f.get_bool("v.u8").is_err());
}

#[test]
fn writer_refuses_what_the_reader_would_reject() {
    let msg = |r: Result<&mut GgufWriter<'_>, GgufError>| r.err().expect("accepted").to_string();
    let mut w = GgufWriter::new();
    w.add_metadata("k", 1u32).unwrap();
    w.add_tensor("t", GgmlType::F32, &[2], vec![0u8; 8])
        .unwrap();
    assert_eq!(
        msg(w.add_metadata("k", 2u32)),
        r#"gguf writer: duplicate metadata key "k""#
    );
    assert_eq!(
        msg(w.add_tensor("t", GgmlType::F32, &[2], vec![0u8; 8])),
        r#"gguf writer: duplicate tensor name "t""#
    );
    assert!(msg(w.add_tensor("u", GgmlType::F32, &[2], vec![0u8; 7]))
        .contains("7 bytes of data, but F32 [2] takes 8"));
    assert!(msg(w.add_tensor("u", GgmlType::Q4_K, &[32], vec![]))
        .contains("not a multiple of the Q4_K block size 256"));
    assert!(
        msg(w.add_tensor("u", GgmlType::F32, &[1, 1, 1, 1, 1], vec![])).contains("5 dimensions")
    );
    assert!(msg(w.set_alignment(48)).contains("alignment 48 is not a power of two"));
    assert!(msg(w.add_metadata("general.alignment", 32i32)).contains("must be a u32 power of two"));
    assert!(msg(w.set_version(1)).contains("cannot write GGUF version 1"));
    let mut deep = Array::U8(vec![]);
    for _ in 0..8 {
        deep = Array::Array(vec![deep]);
    }
    assert!(msg(w.add_metadata("deep", Value::Array(deep))).contains("nested deeper than 8"));
    // set_metadata replaces in place.
    w.set_metadata("k", "now a string").unwrap();
    let f = GgufFile::from_bytes(w.to_bytes(), "w.gguf").unwrap();
    assert_eq!(
        f.metadata()[0],
        ("k".to_string(), Value::from("now a string"))
    );
}

#[test]
fn open_missing_file_names_it() {
    let e = GgufFile::open("/nonexistent/dir/x.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/dir/x.gguf: "), "{e}");
}

fn arb_array(depth: u32) -> BoxedStrategy<Array> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..5).prop_map(Array::U8),
        prop::collection::vec(any::<i16>(), 0..5).prop_map(Array::I16),
        prop::collection::vec(any::<u32>(), 0..5).prop_map(Array::U32),
        prop::collection::vec(any::<bool>(), 0..5).prop_map(Array::Bool),
        prop::collection::vec(".{0,6}", 0..5).prop_map(Array::String),
        prop::collection::vec(any::<i64>(), 0..5).prop_map(Array::I64),
        prop::collection::vec(-1e9f64..1e9, 0..5).prop_map(Array::F64),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        leaf,
        prop::collection::vec(arb_array(depth - 1), 0..4).prop_map(Array::Array)
    ]
    .boxed()
}

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        (-1e30f32..1e30).prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        arb_array(3).prop_map(Value::Array),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        (-1e300f64..1e300).prop_map(Value::F64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn arbitrary_files_round_trip(
        values in prop::collection::vec(arb_value(), 0..12),
        tensors in prop::collection::vec((0usize..4, 1u64..4, 1u64..3), 0..6),
        alignment_log2 in 0u32..8,
    ) {
        let types = [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::I8];
        let mut w = GgufWriter::new();
        w.set_alignment(1 << alignment_log2).unwrap();
        for (i, v) in values.iter().enumerate() {
            w.add_metadata(&format!("k{i}"), v.clone()).unwrap();
        }
        let mut datas = Vec::new();
        for (i, &(ty, blocks, rows)) in tensors.iter().enumerate() {
            let ty = types[ty];
            let dims = [blocks * ty.block_size() as u64, rows];
            let data = pattern(ty.row_bytes(dims[0] * dims[1]).unwrap() as usize, i as u8);
            w.add_tensor(&format!("t{i}"), ty, &dims, data.clone()).unwrap();
            datas.push(data);
        }
        let f = GgufFile::from_bytes(w.to_bytes(), "prop.gguf").unwrap();
        prop_assert_eq!(f.metadata().len(), values.len() + 1);
        for (i, v) in values.iter().enumerate() {
            prop_assert_eq!(f.get(&format!("k{i}")), Some(v));
        }
        for (t, data) in f.tensors().iter().zip(&datas) {
            prop_assert_eq!(f.tensor_data(t), data.as_slice());
        }
    }
}

#[test]
fn reads_a_file_written_by_gguf_py() {
    // Made by tests/data/make_ggufpy_fixture.py (gguf-py 0.19.0): an independent writer.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ggufpy_v3.gguf");
    let f = GgufFile::open(path).unwrap();
    assert_eq!((f.version(), f.alignment()), (3, 32));
    assert_eq!(f.architecture(), Some("deepseek2"));
    let get = |k: &str| f.get(k).unwrap_or_else(|| panic!("{k} missing")).clone();
    assert_eq!(get("t.u8"), Value::U8(200));
    assert_eq!(get("t.i8"), Value::I8(-100));
    assert_eq!(get("t.u16"), Value::U16(60000));
    assert_eq!(get("t.i16"), Value::I16(-30000));
    assert_eq!(get("t.u32"), Value::U32(4_000_000_000));
    assert_eq!(get("t.i32"), Value::I32(-2_000_000_000));
    assert_eq!(get("t.f32"), Value::F32(0.15625));
    assert_eq!(get("t.bool"), Value::Bool(true));
    assert_eq!(get("t.str"), Value::from("héllo ✓"));
    assert_eq!(get("t.u64"), Value::U64((1 << 63) + 5));
    assert_eq!(get("t.i64"), Value::I64(-(1 << 62)));
    assert_eq!(get("t.f64"), Value::F64(1e-300));
    assert_eq!(get("t.tokens"), Value::from(vec!["<s>", "</s>", "Ġa"]));
    assert_eq!(
        get("t.nested"),
        Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![3])
        ]))
    );
    assert_eq!(
        &*f.get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap(),
        &[1, 3, 6]
    );

    let t = f.tensor("f32").unwrap();
    assert_eq!(
        (t.ggml_type, t.dims.as_slice(), t.shape()),
        (GgmlType::F32, &[4u64, 3][..], vec![3, 4])
    );
    let values: Vec<f32> = f
        .tensor_data(t)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values, (0..12).map(|x| x as f32).collect::<Vec<_>>());
    let t = f.tensor("f16").unwrap();
    assert_eq!((t.ggml_type, t.n_bytes), (GgmlType::F16, 10));
    assert_eq!(&f.tensor_data(t)[6..8], &0x7bffu16.to_le_bytes()); // 65504 in f16
    let t = f.tensor("q8").unwrap();
    assert_eq!(
        (t.ggml_type, t.dims.as_slice()),
        (GgmlType::Q8_0, &[32u64, 2][..])
    );
    assert_eq!(
        f.tensor_data(t),
        (0..68).map(|x| x as u8).collect::<Vec<_>>().as_slice()
    );
    let t = f.tensor("i8").unwrap();
    assert_eq!(f.tensor_data(t), &[0xff, 0, 1]);
}

#[test]
fn metadata_only_file_has_no_padding() {
    // Found by cargo-fuzz (tests/data/fuzz/oom_metadata_only_alignment_2p30.gguf): with
    // 2^30 alignment and no tensors, padding the empty data section took 1 GiB.
    let mut w = GgufWriter::new();
    w.set_alignment(1 << 30).unwrap();
    let bytes = w.to_bytes();
    assert_eq!(bytes.len(), 24 + 8 + 17 + 4 + 4);
    let f = GgufFile::from_bytes(&bytes, "m.gguf").unwrap();
    assert_eq!(f.alignment(), 1 << 30);
    assert!(f.tensors().is_empty());
}
