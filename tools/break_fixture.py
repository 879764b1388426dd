"""Broken-on-purpose GGUF fixtures for `mlaserve doctor` (tests/fixtures/broken/).

Each file is one of the tiny F32 fixtures (tests/fixtures/models/) with exactly one defect that
real files or loaders have had (mla.md §0, §4, §5), rewritten with gguf-py's GGUFReader/GGUFWriter:

- deepseek_v3-legacy-kvb-scrambled.gguf  (from deepseek_v3-legacy-f32.gguf)
    attn_kv_b rows rebuilt as cat([K_h for all h], [V_h for all h]) instead of per head [K_h; V_h]
    (the GLM-5.2 vLLM GGUF adapter bug, mla.md §5).
- deepseek_v3-yarn-twice.gguf  (from deepseek_v3-f32.gguf)
    rope.scaling.yarn_log_multiplier = mscale_all_dim (1.0) instead of 0.1*mscale_all_dim (0.1):
    the 0.1 not applied (or divided out twice); mscale 1+ln4 = 2.386 instead of 1.139.
- deepseek_v3-no-expert-scale.gguf  (from deepseek_v3-f32.gguf)
    deepseek2.expert_weights_scale removed: routed experts weighted 1.0 instead of 2.5.
- glm_moe_dsa-rope-permuted.gguf  (from glm_moe_dsa-f32.gguf)
    the R = 16 rope rows of every q_b head and the k_pe rows of kv_a reordered from interleaved
    pairs to half-split order (rows 0,2,..,14,1,3,..,15), what a converter "fixing" the rope for
    NeoX would do; run with the model's own interleaved rope, every q.k rope term is wrong.

Invariants (checked after writing, by re-reading both files): every key, every tensor's name,
type, shape and bytes, and their order equal the source except the documented edit; the edited
tensors equal the documented transformation of the source tensors. The rewrite is deterministic
(no randomness; GGUFWriter output depends only on its input), so a rerun gives identical bytes.

The four GGUFs are not committed: the Rust tests rebuild them at test time with the same edits
(crates/model/tests/broken_fixtures/) and check size and sha256 against manifest.json, so this
script is the cross-check recipe (gguf-py rewrite plus the invariant check above) and the maker of
what IS committed: manifest.json and the reference dumps. Rerun it when a source fixture changes;
the GGUFs it writes into tests/fixtures/broken/ are ignored by git.

Also writes the reference probe dumps (tools/hf_dump.py, len13 prompt of each model's
reference.json) and manifest.json (sizes, sha256, edits, and with --measure the logit damage each
defect does, measured by running the broken weights/metadata through HF transformers).

    python tools/break_fixture.py [--measure] [--out tests/fixtures/broken]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODELS = REPO / "tests" / "fixtures" / "models"
DROP = object()  # key_edits value: remove the key


@dataclass
class Edit:
    """One defect: key edits (value or DROP) and tensor edits (name -> new torch-order array)."""

    keys: dict[str, object] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)


def _fields(reader) -> dict:
    return {f.name: f for f in reader.fields.values() if not f.name.startswith("GGUF.")}


def _u(fields: dict, key: str) -> int:
    if key not in fields:
        raise KeyError(f"source file has no {key}")
    return int(fields[key].contents())


def halfsplit_order(r: int) -> np.ndarray:
    """Row order that turns interleaved rope pairs (2i, 2i+1) into half-split pairs (i, i + r/2):
    new row j = old row order[j], order = [0, 2, .., r-2, 1, 3, .., r-1]."""
    if r % 2:
        raise ValueError(f"rope dimension {r} is odd")
    return np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])


# --- the four defects --------------------------------------------------------------------------


def edit_kvb_scrambled(reader) -> Edit:
    """attn_kv_b [N*(P+V), L] per head [K_h; V_h] -> cat(all K_h, all V_h)."""
    fl = _fields(reader)
    arch = fl["general.architecture"].contents()
    n = _u(fl, f"{arch}.attention.head_count")
    r = _u(fl, f"{arch}.rope.dimension_count")
    if f"{arch}.attention.key_length_mla" in fl:
        raise ValueError("kv_b scramble needs a legacy (attn_kv_b) file; this one has key_length_mla")
    p = _u(fl, f"{arch}.attention.key_length") - r  # legacy: key_length = nope + rope
    v = _u(fl, f"{arch}.attention.value_length")
    out = Edit()
    for t in reader.tensors:
        if not t.name.endswith(".attn_kv_b.weight"):
            continue
        kv_b = np.asarray(t.data, dtype=np.float32)  # [N*(P+V), L]
        if kv_b.shape[0] != n * (p + v):
            raise ValueError(f"{t.name}: {kv_b.shape[0]} rows, expected n_head*(nope+v) = {n}*({p}+{v})")
        per_head = kv_b.reshape(n, p + v, -1)  # [N, P+V, L]
        k = per_head[:, :p].reshape(n * p, -1)  # [N*P, L]
        vv = per_head[:, p:].reshape(n * v, -1)  # [N*V, L]
        out.tensors[t.name] = np.concatenate([k, vv], axis=0)
    if not out.tensors:
        raise ValueError("no attn_kv_b tensor in the source")
    return out


def edit_yarn_twice(reader) -> Edit:
    fl = _fields(reader)
    arch = fl["general.architecture"].contents()
    key = f"{arch}.rope.scaling.yarn_log_multiplier"
    if key not in fl:
        raise KeyError(f"source has no {key}")
    good = float(fl[key].contents())  # 0.1 * mscale_all_dim
    return Edit(keys={key: float(np.float32(good / 0.1))})  # = mscale_all_dim


def edit_no_expert_scale(reader) -> Edit:
    fl = _fields(reader)
    arch = fl["general.architecture"].contents()
    key = f"{arch}.expert_weights_scale"
    if key not in fl:
        raise KeyError(f"source has no {key}")
    return Edit(keys={key: DROP})


def edit_rope_permuted(reader) -> Edit:
    """q_b rows [N*(P+R), Lq]: per head the last R rows; kv_a rows [L+R, H]: the last R rows."""
    fl = _fields(reader)
    arch = fl["general.architecture"].contents()
    n = _u(fl, f"{arch}.attention.head_count")
    r = _u(fl, f"{arch}.rope.dimension_count")
    p = _u(fl, f"{arch}.attention.key_length_mla") - r
    lkv = _u(fl, f"{arch}.attention.kv_lora_rank")
    order = halfsplit_order(r)
    out = Edit()
    for t in reader.tensors:
        a = np.asarray(t.data, dtype=np.float32)
        if re.fullmatch(r"blk\.\d+\.attn_q_b\.weight", t.name):
            if a.shape[0] != n * (p + r):
                raise ValueError(f"{t.name}: {a.shape[0]} rows, expected n_head*(nope+rope) = {n}*({p}+{r})")
            heads = a.reshape(n, p + r, -1).copy()  # [N, P+R, Lq]
            heads[:, p:] = heads[:, p:][:, order]
            out.tensors[t.name] = heads.reshape(a.shape)
        elif re.fullmatch(r"blk\.\d+\.attn_kv_a_mqa\.weight", t.name):
            if a.shape[0] != lkv + r:
                raise ValueError(f"{t.name}: {a.shape[0]} rows, expected kv_lora+rope = {lkv}+{r}")
            b = a.copy()  # [L+R, H]
            b[lkv:] = a[lkv:][order]
            out.tensors[t.name] = b
    if not any(k.endswith("attn_q_b.weight") for k in out.tensors):
        raise ValueError("no attn_q_b tensor in the source (a q_lora-less file needs attn_q)")
    return out


@dataclass(frozen=True)
class Break:
    out: str
    source: str  # relative to tests/fixtures/models
    edit: Callable
    what: str


BREAKS = [
    Break(
        "deepseek_v3-legacy-kvb-scrambled.gguf",
        "deepseek_v3/deepseek_v3-legacy-f32.gguf",
        edit_kvb_scrambled,
        "blk.*.attn_kv_b rows = cat(K of all heads, V of all heads) instead of per head [K_h; V_h]",
    ),
    Break(
        "deepseek_v3-yarn-twice.gguf",
        "deepseek_v3/deepseek_v3-f32.gguf",
        edit_yarn_twice,
        "deepseek2.rope.scaling.yarn_log_multiplier = 1.0 (= mscale_all_dim) instead of 0.1",
    ),
    Break(
        "deepseek_v3-no-expert-scale.gguf",
        "deepseek_v3/deepseek_v3-f32.gguf",
        edit_no_expert_scale,
        "deepseek2.expert_weights_scale (2.5) removed",
    ),
    Break(
        "glm_moe_dsa-rope-permuted.gguf",
        "glm_moe_dsa/glm_moe_dsa-f32.gguf",
        edit_rope_permuted,
        "rope rows of blk.*.attn_q_b (per head) and blk.*.attn_kv_a_mqa (k_pe) permuted interleaved -> half-split",
    ),
]


# --- rewrite and verify ------------------------------------------------------------------------


def rewrite(src: Path, out: Path, edit: Edit) -> None:
    import gguf

    reader = gguf.GGUFReader(src)
    fl = _fields(reader)
    unknown = [k for k in edit.keys if k not in fl and edit.keys[k] is DROP]
    if unknown:
        raise KeyError(f"cannot drop missing keys {unknown}")
    writer = gguf.GGUFWriter(out, fl["general.architecture"].contents())
    for name, f in fl.items():
        if name == "general.architecture":
            continue
        value = edit.keys.get(name, f.contents())
        if value is DROP:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"expects an all-F32 source, {t.name} is {t.tensor_type.name}")
        data = edit.tensors.get(t.name, np.asarray(t.data))
        if data.shape != np.asarray(t.data).shape:
            raise ValueError(f"{t.name}: edit changed the shape {np.asarray(t.data).shape} -> {data.shape}")
        writer.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def verify(src: Path, out: Path, edit: Edit) -> dict:
    """Re-read both files: only the documented keys/tensors differ, and exactly as documented."""
    import gguf

    a, b = gguf.GGUFReader(src), gguf.GGUFReader(out)
    fa, fb = _fields(a), _fields(b)
    want_keys = [k for k in fa if edit.keys.get(k) is not DROP]
    if list(fb) != want_keys:
        raise AssertionError(f"{out.name}: key list differs: {sorted(set(fb) ^ set(want_keys))}")
    changed_keys = {}
    for k in fb:
        va, vb = fa[k].contents(), fb[k].contents()
        if k in edit.keys:
            if not np.isclose(float(vb), float(edit.keys[k]), rtol=0, atol=1e-7):
                raise AssertionError(f"{out.name}: {k} = {vb}, wanted {edit.keys[k]}")
            changed_keys[k] = {"was": va, "now": vb}
        elif va != vb or fa[k].types != fb[k].types:
            raise AssertionError(f"{out.name}: {k} changed ({va!r} -> {vb!r})")
    for k, v in edit.keys.items():
        if v is DROP:
            changed_keys[k] = {"was": fa[k].contents(), "now": None}
    if [t.name for t in a.tensors] != [t.name for t in b.tensors]:
        raise AssertionError(f"{out.name}: tensor list or order differs")
    changed_tensors = []
    for ta, tb in zip(a.tensors, b.tensors):
        if ta.tensor_type != tb.tensor_type or list(ta.shape) != list(tb.shape):
            raise AssertionError(f"{out.name}: {ta.name} type/shape changed")
        da, db = np.asarray(ta.data), np.asarray(tb.data)
        if ta.name in edit.tensors:
            if not np.array_equal(db, edit.tensors[ta.name]):
                raise AssertionError(f"{out.name}: {ta.name} is not the edited tensor")
            if np.array_equal(da, db):
                raise AssertionError(f"{out.name}: {ta.name} edit is a no-op")
            if not np.array_equal(np.sort(da, axis=None), np.sort(db, axis=None)):
                raise AssertionError(f"{out.name}: {ta.name} edit is not a pure row permutation")
            changed_tensors.append(ta.name)
        elif da.tobytes() != db.tobytes():
            raise AssertionError(f"{out.name}: {ta.name} changed")
    return {"changed_keys": changed_keys, "changed_tensors": changed_tensors}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def measure(path: Path, source: str) -> dict:
    """Runs a GGUF file's weights AND its metadata semantics through HF (float64, like the
    references): weights mapped back with fixturegen.gguf_to_hf; softmax scale from the file's
    yarn_log_multiplier (llama.cpp: mscale = 1 + 0.1 * (log_mul / 0.1) * ln factor); routed
    scale from expert_weights_scale (absent -> 1.0, as llama.cpp and the engine read it).
    Compares the len13 full-sequence logits with reference.safetensors `f32.len13`."""
    import copy
    import warnings

    import gguf
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    from fixturegen import gguf_to_hf, reference

    model_dir = MODELS / source.split("/")[0]
    ref = json.loads((model_dir / "reference.json").read_text())
    ids = ref["prompts"]["len13"] + ref["variants"]["f32"]["greedy"]["len13"][:-1]
    want = load_file(model_dir / "reference.safetensors")["f32.len13"].astype(np.float64)
    m = AutoModelForCausalLM.from_pretrained(model_dir / "hf", dtype=torch.float32)
    m.set_attn_implementation("eager")
    m.set_experts_implementation("eager")
    m = copy.deepcopy(m).to(torch.float64).eval()
    arrays, _ = gguf_to_hf.read_dequantized(path)
    with warnings.catch_warnings():  # torch.from_numpy on read-only memmaps; load_into copies
        warnings.simplefilter("ignore", UserWarning)
        state = gguf_to_hf.to_hf_state_dict(arrays)
    gguf_to_hf.load_into(m, state)
    cfg = m.config
    fl = _fields(gguf.GGUFReader(path))
    arch = fl["general.architecture"].contents()
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if f"{arch}.rope.scaling.yarn_log_multiplier" in fl:
        log_mul = float(fl[f"{arch}.rope.scaling.yarn_log_multiplier"].contents())
        factor = float(fl[f"{arch}.rope.scaling.factor"].contents())
        scale *= (1.0 + 0.1 * (log_mul / 0.1) * math.log(factor)) ** 2
    routed = float(fl[f"{arch}.expert_weights_scale"].contents()) if f"{arch}.expert_weights_scale" in fl else 1.0
    for a in reference.attention_modules(m):
        a.scaling = scale
    for mod in m.modules():
        if hasattr(mod, "routed_scaling_factor") and hasattr(mod, "e_score_correction_bias"):
            mod.routed_scaling_factor = routed
    got, _ = reference.forward_logits(m, ids)
    n_prompt = len(ref["prompts"]["len13"])
    return {
        "softmax_scale": scale,
        "routed_scaling_factor": routed,
        "max_abs_logit_diff": float(np.abs(got - want).max()),
        "max_abs_logit_diff_pos0": float(np.abs(got[0] - want[0]).max()),
        "argmax_agree_decode_rows": float(np.mean(got[n_prompt - 1 :].argmax(-1) == want[n_prompt - 1 :].argmax(-1))),
    }


def len13_prompt(model: str) -> list[int]:
    return json.loads((MODELS / model / "reference.json").read_text())["prompts"]["len13"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "broken")
    ap.add_argument("--measure", action="store_true", help="run each broken file through HF, record the logit damage")
    ap.add_argument("--no-dumps", action="store_true", help="skip the hf_dump reference files")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"files": {}}
    import gguf

    for br in BREAKS:
        src = MODELS / br.source
        out = args.out / br.out
        edit = br.edit(gguf.GGUFReader(src))
        rewrite(src, out, edit)
        info = verify(src, out, edit)
        entry = {
            "source": f"tests/fixtures/models/{br.source}",
            "source_sha256": sha256(src),
            "defect": br.what,
            **info,
            "size": out.stat().st_size,
            "sha256": sha256(out),
        }
        if args.measure:
            entry["hf_effect_len13"] = {"broken": measure(out, br.source), "control_source": measure(src, br.source)}
        manifest["files"][br.out] = entry
        print(f"{br.out}: {len(info['changed_tensors'])} tensors, keys {list(info['changed_keys'])}", flush=True)

    if not args.no_dumps:
        import hf_dump

        for model, name in (
            ("glm_moe_dsa", "glm_rope_reference.safetensors"),
            ("deepseek_v3", "deepseek_v3_reference.safetensors"),
        ):
            out = args.out / name
            checks = hf_dump.dump(MODELS / model / "hf", len13_prompt(model), out)
            manifest["files"][name] = {
                "source": f"tests/fixtures/models/{model}/hf",
                "tokens": f"reference.json prompts.len13 of {model}",
                "self_checks": checks,
                "size": out.stat().st_size,
                "sha256": sha256(out),
            }
            print(f"{name}: {out.stat().st_size} bytes", flush=True)
    elif (args.out / "manifest.json").exists():
        old = json.loads((args.out / "manifest.json").read_text())["files"]
        manifest["files"].update({k: v for k, v in old.items() if k.endswith(".safetensors")})
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=float) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
