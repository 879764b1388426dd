"""Writes ggufpy_v3.gguf with gguf-py (PyPI `gguf` 0.19.0, numpy 2.4.6), an oracle nobody on
this project wrote, for tests/roundtrip.rs::reads_a_file_written_by_gguf_py.

    python -m venv /tmp/ggufpy && /tmp/ggufpy/bin/pip install gguf==0.19.0
    /tmp/ggufpy/bin/python make_ggufpy_fixture.py
"""
import numpy as np
import gguf

w = gguf.GGUFWriter("ggufpy_v3.gguf", arch="deepseek2")
w.add_uint8("t.u8", 200)
w.add_int8("t.i8", -100)
w.add_uint16("t.u16", 60000)
w.add_int16("t.i16", -30000)
w.add_uint32("t.u32", 4000000000)
w.add_int32("t.i32", -2000000000)
w.add_float32("t.f32", 0.15625)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo ✓")
w.add_uint64("t.u64", 2**63 + 5)
w.add_int64("t.i64", -(2**62))
w.add_float64("t.f64", 1e-300)
w.add_array("t.tokens", ["<s>", "</s>", "Ġa"])
w.add_array("t.nested", [[1, 2], [3]])
w.add_token_types([1, 3, 6])  # i32 array under tokenizer.ggml.token_type
w.add_tensor("f32", np.arange(12, dtype=np.float32).reshape(3, 4))
w.add_tensor("f16", np.array([1.0, -2.0, 0.5, 65504.0, 0.0], dtype=np.float16))
q8 = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)  # two Q8_0 blocks of raw bytes
w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("i8", np.array([-1, 0, 1], dtype=np.int8))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
