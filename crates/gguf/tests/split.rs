//! Split models: shards named `-0000k-of-0000N.gguf` open as one model.

use std::path::Path;

use mlaserve_gguf::{split_path, GgmlType, GgufSplit, GgufWriter};

/// Writes `count` shards of `prefix` in `dir`; shard i holds tensor "t{i}" of 4 bytes of i.
/// `lie` changes shard 1's `split.no` to test the check.
fn write_shards(dir: &Path, prefix: &str, count: usize, tensors_count: i32, lie: bool) {
    for i in 0..count {
        let mut w = GgufWriter::new();
        if i == 0 {
            w.add_metadata("general.architecture", "deepseek2").unwrap();
        }
        let no = if lie && i == 1 { 2u16 } else { i as u16 };
        w.add_metadata("split.no", no).unwrap();
        w.add_metadata("split.count", count as u16).unwrap();
        w.add_metadata("split.tensors.count", tensors_count)
            .unwrap();
        w.add_tensor(&format!("t{i}"), GgmlType::F32, &[1], vec![i as u8; 4])
            .unwrap();
        w.write_file(dir.join(split_path(prefix, i, count)))
            .unwrap();
    }
}

#[test]
fn names_follow_llama_cpp() {
    assert_eq!(split_path("m", 0, 3), "m-00001-of-00003.gguf");
}

#[test]
fn shards_open_as_one_from_any_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), "model", 3, 3, false);
    for i in 0..3 {
        let split = GgufSplit::open(dir.path().join(split_path("model", i, 3))).unwrap();
        assert_eq!(split.shards().len(), 3);
        assert_eq!(split.first().architecture(), Some("deepseek2"));
        assert_eq!(split.n_tensors(), 3);
        for j in 0..3u8 {
            let (shard, t) = split.tensor(&format!("t{j}")).unwrap();
            assert_eq!(shard.tensor_data(t), &[j; 4]);
            assert_eq!(&*split.tensor_bytes(&format!("t{j}")).unwrap(), &[j; 4]);
        }
        let names: Vec<&str> = split.tensors().map(|(_, t)| t.name.as_str()).collect();
        assert_eq!(names, ["t0", "t1", "t2"]);
    }
}

#[test]
fn a_plain_file_is_a_split_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.gguf");
    let mut w = GgufWriter::new();
    w.add_tensor("x", GgmlType::F32, &[2], vec![0u8; 8])
        .unwrap();
    w.write_file(&path).unwrap();
    let split = GgufSplit::open(&path).unwrap();
    assert_eq!(split.shards().len(), 1);
    assert!(split.tensor("x").is_some());
}

#[test]
fn missing_shard_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), "m", 3, 3, false);
    std::fs::remove_file(dir.path().join("m-00003-of-00003.gguf")).unwrap();
    let e = GgufSplit::open(dir.path().join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("m-00003-of-00003.gguf"), "{e}");
}

#[test]
fn wrong_split_no_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), "m", 3, 3, true);
    let e = GgufSplit::open(dir.path().join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is shard 1 of 3, but says split.no Some(2)"),
        "{e}"
    );
}

#[test]
fn wrong_tensor_total_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), "m", 2, 5, false);
    let e = GgufSplit::open(dir.path().join("m-00001-of-00002.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("split.tensors.count is 5, but the shards hold 2 tensors"),
        "{e}"
    );
}

#[test]
fn renamed_shard_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path(), "m", 2, 2, false);
    let renamed = dir.path().join("renamed.gguf");
    std::fs::rename(dir.path().join("m-00001-of-00002.gguf"), &renamed).unwrap();
    let e = GgufSplit::open(&renamed).unwrap_err().to_string();
    assert!(
        e.contains(r#"does not end in "-00001-of-00002.gguf""#),
        "{e}"
    );
}
