#!/usr/bin/env python3
"""Consistency check of the committed demo artifacts (no training, no GPU; ~1 minute on 2 cores).

    /work/pyenv/venv/bin/python tools/demo_model/check_demo.py

Fails (exit 1, naming the problem) unless:
- models/default.gguf is at most 25 MB and its sha256/size are the ones reference.json records;
- its metadata says arch glm-dsa, BF16 file type, index_topk < the longest reference prompt, and
  its embedded chat template equals tests/fixtures/demo/hf's;
- every reference prompt re-tokenizes (tests/fixtures/demo/hf tokenizer) to its prompt_ids, and
  both chat-template renders are reproduced by transformers;
- HF with the GGUF's weights (float32, CPU) reproduces greedy_ids[:n_defined] of `capital_france`,
  `chat_capital_france` and the longest prompt, and "The capital of France is" -> " Paris".
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

GGUF = REPO / "models" / "default.gguf"
FIX = REPO / "tests" / "fixtures" / "demo"
MAX_BYTES = 25 * 1000 * 1000


def fail(msg: str) -> None:
    print(f"FAIL: {msg}")
    raise SystemExit(1)


def main() -> None:
    import gguf
    import torch
    from transformers import AutoTokenizer

    from fixturegen import reference
    from make_reference import load_gguf_model

    torch.set_num_threads(2)
    ref = json.loads((FIX / "reference.json").read_text(encoding="utf-8"))
    data = GGUF.read_bytes()
    if len(data) > MAX_BYTES:
        fail(f"{GGUF} is {len(data)} bytes (> {MAX_BYTES})")
    if hashlib.sha256(data).hexdigest() != ref["gguf"]["sha256"] or len(data) != ref["gguf"]["bytes"]:
        fail(f"{GGUF} is not the file reference.json was made from")
    r = gguf.GGUFReader(GGUF)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    longest = max(p["prompt_len"] for p in ref["prompts"].values())
    if f["general.architecture"] != "glm-dsa" or f["general.file_type"] != 32:
        fail(f"unexpected arch/file type {f['general.architecture']}/{f['general.file_type']}")
    if not f["glm-dsa.attention.indexer.top_k"] < longest:
        fail("no reference prompt is longer than index_topk")
    tok = AutoTokenizer.from_pretrained(FIX / "hf")
    if f["tokenizer.chat_template"] != tok.chat_template:
        fail("the GGUF's chat template differs from tests/fixtures/demo/hf")
    for name, p in ref["prompts"].items():
        if tok.encode(p["prompt_text"], add_special_tokens=False) != p["prompt_ids"]:
            fail(f"{name}: prompt_ids do not match the tokenizer")
        if p["kind"] == "chat" and tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True) != p["prompt_text"]:
            fail(f"{name}: chat template render differs")
    for case in ref["chat_templates"]:
        got = tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=case["add_generation_prompt"])
        if got != case["rendered"] or tok.encode(got, add_special_tokens=False) != case["ids"]:
            fail("chat_templates render or ids differ")
    model = load_gguf_model(FIX / "hf", GGUF)
    longest_name = max(ref["prompts"], key=lambda n: ref["prompts"][n]["prompt_len"])
    for name in ("capital_france", "chat_capital_france", longest_name):
        p = ref["prompts"][name]
        got = reference.greedy(model, p["prompt_ids"], p["n_defined"])
        if got != p["greedy_ids"][: p["n_defined"]]:
            fail(f"{name}: HF greedy {got} != reference {p['greedy_ids'][: p['n_defined']]}")
    ids = tok.encode("The capital of France is", add_special_tokens=False)
    text = tok.decode(reference.greedy(model, ids, 2))
    if text != " Paris.":
        fail(f"'The capital of France is' -> {text!r}, not ' Paris.'")
    print(f"ok: {GGUF.name} {len(data)} bytes; 'The capital of France is' -> {text!r}")


if __name__ == "__main__":
    main()
