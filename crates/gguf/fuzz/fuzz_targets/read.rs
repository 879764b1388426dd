//! Fuzz target `read`: any bytes → `GgufFile::from_bytes` must return, never panic, and
//! whatever it accepts must be fully walkable and must survive write → read unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlaserve_gguf::{render_inspect, GgufFile, GgufWriter};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data, "fuzz.gguf") else {
        return;
    };
    // Walk everything an engine would touch.
    let _ = render_inspect(&file);
    for (key, value) in file.metadata() {
        let _ = (value.to_string(), value.type_name(), format!("{value:?}"));
        let _ = (
            file.get_u64(key),
            file.get_i64(key),
            file.get_f32(key),
            file.get_str(key),
        );
        let _ = (file.get_bool(key), file.get_str_array(key));
        let _ = (
            file.get_i32_array(key),
            file.get_u32_array(key),
            file.get_f32_array(key),
        );
    }
    let mut total = 0u64;
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes);
        assert_eq!(t.shape().iter().product::<usize>() as u64, t.n_elements());
        assert_eq!(&*file.tensor_bytes(t), bytes);
        total += t.n_bytes;
    }
    assert!(total <= file.file_len());

    // Whatever the reader accepts, the writer writes, and the reader reads back the same.
    let mut w = GgufWriter::new();
    w.set_version(file.version()).unwrap();
    for (key, value) in file.metadata() {
        w.add_metadata(key, value.clone())
            .expect("writer rejects what the reader accepted");
    }
    for t in file.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.dims, file.tensor_data(t))
            .expect("writer rejects a tensor the reader accepted");
    }
    let written = w.to_bytes();
    let again =
        GgufFile::from_bytes(&written, "rewritten.gguf").expect("rewritten file must parse");
    assert_eq!(again.tensors().len(), file.tensors().len());
    for (a, b) in again.tensors().iter().zip(file.tensors()) {
        assert_eq!(
            (&a.name, a.ggml_type, &a.dims),
            (&b.name, b.ggml_type, &b.dims)
        );
        assert_eq!(again.tensor_data(a), file.tensor_data(b));
    }
    let mut w2 = GgufWriter::new();
    w2.set_version(again.version()).unwrap();
    for (key, value) in again.metadata() {
        w2.add_metadata(key, value.clone()).unwrap();
    }
    for t in again.tensors() {
        w2.add_tensor(&t.name, t.ggml_type, &t.dims, again.tensor_data(t))
            .unwrap();
    }
    assert!(
        w2.to_bytes() == written,
        "write → read → write is not a fixed point"
    );
});
