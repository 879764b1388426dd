"""GGUF files for a fixture model: llama.cpp's converter (F32/BF16/Q8_0), llama-quantize (Q4_K_M),
and the legacy `attn_kv_b` layout rewritten with gguf-py's GGUFWriter.

Legacy layout invariants (what pre-PR-#12801 deepseek2 files looked like):
- `blk.N.attn_kv_b.weight` torch shape [n_head*(nope+v), kv_lora], rows per head = [K_nope | V],
  rebuilt from the split tensors as cat(k_b.transpose(1,2), v_b, dim=1) per head;
- no `attn_k_b`/`attn_v_b`, no `*.attention.key_length_mla` / `value_length_mla`;
- `key_length` = nope+rope, `value_length` = v, `head_count_kv` = n_head (real per-head dims).
Every other key and tensor is copied byte for byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PRE_TOKENIZER = "gpt-2"


def run_converter(llama_dir: Path, hf_dir: Path, out: Path, outtype: str, model_name: str) -> None:
    cmd = [
        sys.executable,
        str(HERE / "run_converter.py"),
        str(llama_dir),
        PRE_TOKENIZER,
        "--outtype",
        outtype,
        "--outfile",
        str(out),
        "--model-name",
        model_name,
        str(hf_dir),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0 or not out.exists():
        raise RuntimeError(f"converter failed ({res.returncode}) for {out.name}:\n{res.stderr[-4000:]}")


def run_quantize(quantize_bin: Path, src: Path, out: Path, qtype: str) -> str:
    res = subprocess.run([str(quantize_bin), str(src), str(out), qtype, "2"], capture_output=True, text=True)
    if res.returncode != 0 or not out.exists():
        raise RuntimeError(f"llama-quantize failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout + res.stderr


def write_legacy(src: Path, out: Path) -> dict:
    """Rewrites a converted (split k_b/v_b) deepseek2 file into the legacy attn_kv_b layout."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    fields = {f.name: f for f in reader.fields.values()}
    n_head = int(fields[f"{arch}.attention.head_count"].contents())
    key_mla = int(fields[f"{arch}.attention.key_length_mla"].contents())
    val_mla = int(fields[f"{arch}.attention.value_length_mla"].contents())
    writer = gguf.GGUFWriter(out, arch)
    dropped = {f"{arch}.attention.key_length_mla", f"{arch}.attention.value_length_mla"}
    replaced = {
        f"{arch}.attention.key_length": key_mla,
        f"{arch}.attention.value_length": val_mla,
        f"{arch}.attention.head_count_kv": n_head,
    }
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF.") or field.name in dropped:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = replaced.get(field.name, field.contents())
        writer.add_key_value(field.name, value, vtype, sub_type=sub)

    by_name = {t.name: t for t in reader.tensors}
    out_tensors: list[tuple[str, np.ndarray, object]] = []
    for t in reader.tensors:
        if t.name.endswith("attn_v_b.weight"):
            continue
        if t.name.endswith("attn_k_b.weight"):
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                raise ValueError(f"legacy rewrite expects an F32 source, {t.name} is {t.tensor_type.name}")
            v = by_name[t.name.replace("attn_k_b", "attn_v_b")]
            k_b = np.asarray(t.data)  # [N, Lkv, P]
            v_b = np.asarray(v.data)  # [N, V, Lkv]
            n, lkv, p = k_b.shape
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(n * (p + v_b.shape[1]), lkv)
            out_tensors.append((t.name.replace("attn_k_b", "attn_kv_b"), np.ascontiguousarray(kv_b), t.tensor_type))
            continue
        out_tensors.append((t.name, np.asarray(t.data), t.tensor_type))
    for name, data, ttype in out_tensors:
        if ttype != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"legacy rewrite expects an all-F32 source, {name} is {ttype.name}")
        writer.add_tensor(name, data.astype(np.float32, copy=False))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"head_count_kv": n_head, "key_length": key_mla, "value_length": val_mla}
