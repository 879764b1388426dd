#!/usr/bin/env python3
"""Driver of the demo model recipe (models/README.md has the full story).

    PY=/work/pyenv/venv/bin/python
    $PY tools/demo_model/make_demo.py data --wheel transformers-5.24.0-py3-none-any.whl
        corpus + tokenizer + tokenized corpus + trimmed transformers for the GPU -> .device/demo
    (train: tools/demo_model/train.py on the GPU machine, see models/README.md)
    $PY tools/demo_model/make_demo.py finish --trained DIR --llama-cpp LLAMA_CPP_DIR
        DIR holds train.py's output (model.safetensors or its parts model.safetensors.partNN,
        train_log.json, eval_train.json). Writes the HF checkpoint to .device/demo/hf (not in
        git), models/default.gguf (BF16), tests/fixtures/demo/{hf/,reference.json,eval.json,
        train_log.json}.

`finish` invariants (each is checked, the run aborts otherwise):
- the reassembled model.safetensors has the sha256 train.py recorded;
- the HF checkpoint reloads bit-identically (fixturegen.build.check_saved_weights);
- every tensor of models/default.gguf, dequantized and mapped back to HF names, is bit-identical
  to train.bf16_as_gguf(trained weights), i.e. what train.py's `gguf_bf16` evaluation used;
- the GGUF is at most MAX_GGUF_BYTES.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

DATA = REPO / ".device" / "demo"
GGUF_OUT = REPO / "models" / "default.gguf"
FIXTURES = REPO / "tests" / "fixtures" / "demo"
MAX_GGUF_BYTES = 25 * 1000 * 1000
MODEL_NAME = "mlaserve-demo"
# transformers sub-packages kept in the trimmed copy for the GPU machine (models/* is 52 MB).
KEEP_MODELS = ("__init__.py", "auto", "encoder_decoder", "glm_moe_dsa")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def trim_transformers(wheel: Path, out: Path) -> None:
    """transformers from `wheel` without the model families the demo does not use, as .tar.gz."""
    with zipfile.ZipFile(wheel) as z, tarfile.open(out, "w:gz") as tar:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            parts = info.filename.split("/")
            if parts[0] != "transformers" or info.is_dir():
                continue
            if len(parts) > 2 and parts[1] == "models" and parts[2] not in KEEP_MODELS:
                continue
            data = z.read(info)
            ti = tarfile.TarInfo(info.filename)
            ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
            tar.addfile(ti, io.BytesIO(data))


def cmd_data(args) -> None:
    import make_corpus
    import tokenizer

    docs, ev = make_corpus.build()
    DATA.mkdir(parents=True, exist_ok=True)
    with open(DATA / "corpus.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    ev["seed"] = make_corpus.SEED
    (DATA / "eval.json").write_text(json.dumps(ev, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    sys.argv = ["tokenizer.py", "--data", str(DATA)]
    tokenizer.main()
    if args.wheel:
        trim_transformers(args.wheel, DATA / "transformers-5.24.0-trimmed.tar.gz")
    for p in sorted(DATA.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(REPO)}  {p.stat().st_size}  {sha256(p)[:16]}")


def assemble(trained: Path) -> Path:
    """model.safetensors from `trained` (joined from its parts if split), sha256-checked."""
    log = json.loads((trained / "train_log.json").read_text())
    out = DATA / "trained" / "model.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    whole = trained / "model.safetensors"
    parts = sorted(trained.glob("model.safetensors.part*"))
    if whole.exists():
        shutil.copyfile(whole, out)
    elif parts:
        with open(out, "wb") as f:
            for p in parts:
                f.write(p.read_bytes())
    else:
        raise SystemExit(f"{trained}: neither model.safetensors nor model.safetensors.part* found")
    if sha256(out) != log["model_safetensors_sha256"]:
        raise SystemExit(f"{out}: sha256 differs from train_log.json (parts missing or corrupted?)")
    for name in ("train_log.json", "eval_train.json"):
        shutil.copyfile(trained / name, out.parent / name)
    return out


def build_hf(state_path: Path, hf_dir: Path):
    """The trained weights as an HF checkpoint (float32) with tokenizer and GLM config keys."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    import recipe
    import train
    from fixturegen import build
    from fixturegen.specs import ModelSpec

    special = json.loads((DATA / "tokenizer" / "special_ids.json").read_text())
    cfg = train.build_config(special)
    model = train.build_model(cfg, 0)
    state = load_file(str(state_path))
    own = model.state_dict()
    if set(own) != set(state):
        raise SystemExit(f"trained state keys differ from the model: {sorted(set(own) ^ set(state))[:8]}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
    spec = ModelSpec(name="demo", arch="GlmMoeDsaForCausalLM", hf_config=recipe.MODEL,
                     extra_config_json=recipe.EXTRA_CONFIG_JSON, tokenizer="glm", base_seed=recipe.TRAIN["seed"])
    tok = AutoTokenizer.from_pretrained(DATA / "tokenizer")
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    build.save_hf(model, spec, tok, "glm", hf_dir, special)
    build.check_saved_weights(model, hf_dir)
    return model, {k: v.to(torch.float32) for k, v in state.items()}


def check_gguf_equals_bf16(gguf_path: Path, state) -> dict:
    import torch

    import train
    from fixturegen import gguf_to_hf

    arrays, types = gguf_to_hf.read_dequantized(gguf_path)
    got = gguf_to_hf.to_hf_state_dict(arrays)
    want = train.bf16_as_gguf(state)
    if set(got) != set(want):
        raise SystemExit(f"GGUF->HF keys differ: {sorted(set(got) ^ set(want))[:8]}")
    for k in want:
        if not torch.equal(got[k], want[k]):
            raise SystemExit(f"{k}: GGUF tensor is not the BF16 rounding of the trained weight")
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    return counts


def cmd_finish(args) -> None:
    import make_reference
    from fixturegen import convert

    t0 = time.time()
    state_path = assemble(args.trained)
    hf_dir = DATA / "hf"
    model, state = build_hf(state_path, hf_dir)
    GGUF_OUT.parent.mkdir(parents=True, exist_ok=True)
    convert.run_converter(args.llama_cpp, hf_dir, GGUF_OUT, "bf16", MODEL_NAME)
    size = GGUF_OUT.stat().st_size
    if size > MAX_GGUF_BYTES:
        raise SystemExit(f"{GGUF_OUT} is {size} bytes, over the {MAX_GGUF_BYTES} limit")
    types = check_gguf_equals_bf16(GGUF_OUT, state)
    print(f"{GGUF_OUT.relative_to(REPO)}: {size} bytes, tensor types {types}, bit-identical to bf16_as_gguf", flush=True)

    FIXTURES.mkdir(parents=True, exist_ok=True)
    keep = FIXTURES / "hf"
    keep.mkdir(exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(hf_dir / name, keep / name)
    shutil.copyfile(args.trained / "train_log.json", FIXTURES / "train_log.json")
    make_reference.write_all(hf_dir, GGUF_OUT, DATA / "eval.json", FIXTURES, args.llama_cpp,
                             skip_eval=args.skip_eval, gguf_meta={"bytes": size, "sha256": sha256(GGUF_OUT), "tensor_types": types})
    print(f"finish done in {time.time() - t0:.0f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data")
    d.add_argument("--wheel", type=Path, help="transformers-5.24.0-py3-none-any.whl to trim for the GPU machine")
    f = sub.add_parser("finish")
    f.add_argument("--trained", type=Path, required=True)
    f.add_argument("--llama-cpp", type=Path, required=True)
    f.add_argument("--skip-eval", action="store_true", help="skip the CPU re-evaluation (slow on 2 cores)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    {"data": cmd_data, "finish": cmd_finish}[args.cmd](args)


if __name__ == "__main__":
    main()
