#!/usr/bin/env python3
"""Second oracle: llama.cpp's runtime on the fixture GGUF files, compared with the HF references.

    LLAMA_CPP_LIB_PATH=/path/to/build-shared/bin PYTHONPATH=/path/to/llama_cpp_python-0.3.36 \
        python tools/llamacpp_oracle.py [--model NAME]

Uses the llama-cpp-python 0.3.36 bindings (from its sdist) over a shared libllama built from the
same sdist's vendor/llama.cpp. Every file is evaluated on `prompt + greedy[:-1]` of every
reference prompt in one batch, with `logits_all`, an F32 KV cache (the default F16 cache can flip
near-tie DSA selections), 2 threads. Writes `<model>/llamacpp_oracle.json`: per file and prompt the
max |llama.cpp - reference| over all rows, over the prompt rows, and whether the argmax agrees on
every row, plus the median over rows of the per-row max |diff| and the fraction of rows whose
argmax agrees. If llama.cpp aborts, the file is retried with CPU weight repacking off
(`use_extra_bufts = false`; at commit 0c1e570 the repacked Q8_0/Q4_K path aborts on these models
with GGML_ASSERT(*cur_backend_id != -1) in ggml-backend.cpp). Nothing here feeds the references;
it only cross-checks them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "tests" / "fixtures" / "models"


def file_variants(model_dir: Path) -> dict[str, str]:
    name = model_dir.name
    out = {}
    for v in ("f32", "bf16", "q8_0", "q4_k_m"):
        if (model_dir / f"{name}-{v}.gguf").exists():
            out[f"{name}-{v}.gguf"] = v
    if (model_dir / f"{name}-legacy-f32.gguf").exists():
        out[f"{name}-legacy-f32.gguf"] = "f32"
    return out


def run_file(path: Path, seqs: dict[str, list[int]], extra_bufts: bool) -> dict[str, np.ndarray]:
    import llama_cpp

    if not extra_bufts:  # no CPU weight repacking (the Llama class does not expose the flag)
        low = llama_cpp.llama_cpp  # the module llama.py calls through
        default = low.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = params
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=64,
        n_batch=64,
        n_ubatch=64,
        logits_all=True,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        n_threads=2,
        n_threads_batch=2,
        verbose=False,
    )
    out = {}
    for pname, ids in seqs.items():
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(ids)
        out[pname] = np.array(llm.scores[: len(ids)], dtype=np.float64)
    del llm
    return out


def run_isolated(path: Path, seqs: dict[str, list[int]]):
    """Runs one file in a child process (llama.cpp aborts on some files); retries without CPU
    weight repacking if the first run dies. Returns (logits or None, description)."""
    tmp = Path(tempfile.mkdtemp())
    (tmp / "seqs.json").write_text(json.dumps(seqs))
    errors = []
    for extra in ("1", "0"):
        cmd = [sys.executable, __file__, "--one", str(path), str(tmp / "seqs.json"), str(tmp / "out.npz"), extra]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode == 0:
            with np.load(tmp / "out.npz") as z:
                return {k: z[k] for k in z.files}, f"ok (use_extra_bufts={extra == '1'})"
        tail = [ln for ln in res.stderr.splitlines() if "GGML_ASSERT" in ln or "error" in ln.lower()]
        errors.append(f"use_extra_bufts={extra == '1'}: exit {res.returncode}: {' | '.join(tail[:2])[:300]}")
    return None, "; ".join(errors)


def check_model(model_dir: Path) -> dict:
    from safetensors.numpy import load_file

    ref = json.loads((model_dir / "reference.json").read_text())
    logits = load_file(str(model_dir / "reference.safetensors"))
    result = {}
    for fname, variant in file_variants(model_dir).items():
        greedy = ref["variants"][variant]["greedy"]
        seqs = {p: ids + greedy[p][:-1] for p, ids in ref["prompts"].items()}
        got, how = run_isolated(model_dir / fname, seqs)
        if got is None:
            result[fname] = {"reference_variant": variant, "error": how}
            print(f"{model_dir.name}/{fname}: llama.cpp failed: {how}", flush=True)
            continue
        per = {}
        row_max = []
        agree = []
        for p, g in got.items():
            want_all = logits[f"{variant}.{p}"].astype(np.float64)
            row_max += np.abs(g - want_all).max(-1).tolist()
            agree += (g.argmax(-1) == want_all.argmax(-1)).tolist()
            want = logits[f"{variant}.{p}"].astype(np.float64)
            n = len(ref["prompts"][p])
            per[p] = {
                "max_abs_all_rows": float(np.abs(g - want).max()),
                "max_abs_prompt_rows": float(np.abs(g[:n] - want[:n]).max()),
                "argmax_agrees_all_rows": bool((g.argmax(-1) == want.argmax(-1)).all()),
            }
        result[fname] = {
            "reference_variant": variant,
            "run": how,
            "rows": len(row_max),
            "median_row_max_abs": float(np.median(row_max)),
            "rows_argmax_agree_fraction": float(np.mean(agree)),
            "prompts": per,
        }
        worst = max(v["max_abs_all_rows"] for v in per.values())
        print(
            f"{model_dir.name}/{fname} vs {variant}: max |diff| {worst:.3e}, median row max "
            f"{result[fname]['median_row_max_abs']:.3e}, argmax agree {result[fname]['rows_argmax_agree_fraction']:.3f}",
            flush=True,
        )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all")
    ap.add_argument("--one", nargs=4, metavar=("GGUF", "SEQS_JSON", "OUT_NPZ", "EXTRA_BUFTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        gguf_path, seqs_json, out_npz, extra = args.one
        got = run_file(Path(gguf_path), json.loads(Path(seqs_json).read_text()), extra == "1")
        np.savez(out_npz, **got)
        return
    import llama_cpp

    dirs = sorted(d for d in MODELS.iterdir() if d.is_dir()) if args.model == "all" else [MODELS / args.model]
    for d in dirs:
        res = check_model(d)
        doc = {
            "llama_cpp_python": llama_cpp.__version__,
            "settings": "n_ctx 64, one batch per sequence, logits_all, KV cache F32/F32, 2 threads, CPU",
            "files": res,
        }
        (d / "llamacpp_oracle.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
