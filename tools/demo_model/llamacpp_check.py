#!/usr/bin/env python3
"""Independent cross-check of models/default.gguf with llama.cpp's own runtime (glm-dsa graph).

    LLAMA_CPP_LIB_PATH=$LLAMA/build-shared/bin PYTHONPATH=/path/to/llama_cpp_python-0.3.36 \
        /work/pyenv/venv/bin/python tools/demo_model/llamacpp_check.py

For every prompt of tests/fixtures/demo/reference.json, llama.cpp (llama-cpp-python 0.3.36 bindings
over a libllama built from the same sdist, F32 KV cache, 2 threads) evaluates
`prompt_ids + greedy_ids[:n_defined - 1]` with all logits; at each of the n_defined generation rows
we record whether its argmax equals the reference greedy id and the max |difference| of the
reference's top-5 logits. Writes tests/fixtures/demo/llamacpp_check.json. Nothing here feeds the
reference; it only shows a second implementation agrees with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
FIX = REPO / "tests" / "fixtures" / "demo"
GGUF = REPO / "models" / "default.gguf"


def main() -> None:
    import llama_cpp

    ref = json.loads((FIX / "reference.json").read_text(encoding="utf-8"))
    llm = llama_cpp.Llama(model_path=str(GGUF), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                          n_threads=2, n_threads_batch=2, verbose=False)
    out = {"how": __doc__.split("\n\n")[1].strip(), "prompts": {}}
    all_ok = True
    for name, p in ref["prompts"].items():
        n = p["n_defined"]
        ids = p["prompt_ids"] + p["greedy_ids"][: max(0, n - 1)]
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float64)
        rows = range(len(p["prompt_ids"]) - 1, len(p["prompt_ids"]) - 1 + n)
        argmax = [int(scores[r].argmax()) for r in rows]
        diffs = [max(abs(scores[r][i] - v) for i, v in top) for r, top in zip(rows, p["top5"][:n])]
        ok = argmax == p["greedy_ids"][:n]
        all_ok &= ok
        out["prompts"][name] = {"n_defined": n, "argmax_agrees": ok,
                                "first_disagreement": next((i for i, (a, b) in enumerate(zip(argmax, p["greedy_ids"])) if a != b), None),
                                "max_abs_top5_logit_diff": float(max(diffs)) if diffs else 0.0}
        print(f"{name}: argmax agrees {ok}, max |top5 logit diff| {out['prompts'][name]['max_abs_top5_logit_diff']:.2e}", flush=True)
    out["all_agree"] = all_ok
    (FIX / "llamacpp_check.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
