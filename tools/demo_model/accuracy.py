"""Accuracy of a demo model on the evaluation sets of make_corpus.py (greedy decoding).

Used by train.py (on the GPU, right after training) and by make_reference.py (on the CPU, with
the weights dequantized from the shipped GGUF: the numbers in models/README.md).

Invariants:
- greedy decoding is exact and padding-free: prompts are grouped by token length and each group
  is decoded with full uncached forwards (`use_cache=False`), so no attention mask or position
  offset is involved;
- generation stops at the first id in `stop_ids` (not included in the text);
- a plain completion is correct iff the generated text starts with " " + answer followed by a
  non-letter (so " Parisian" does not count as " Paris"); a chat answer is `exact` iff it equals
  the expected sentence and `contains` iff the value occurs as a whole word; a counting answer
  is correct iff the generated text starts with the expected sequence.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

PLAIN_NEW = 8
CHAT_NEW = 24
MAX_GROUP = 256


@torch.no_grad()
def greedy_batch(model, prompts: list[list[int]], n_new: int, stop_ids: set[int], device) -> list[list[int]]:
    """Greedy continuations (at most n_new ids, cut before the first stop id) for every prompt."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        groups[len(p)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for _, idx in sorted(groups.items()):
        for s in range(0, len(idx), MAX_GROUP):
            chunk = idx[s : s + MAX_GROUP]
            x = torch.tensor([prompts[i] for i in chunk], dtype=torch.long, device=device)  # [b, T]
            done = torch.zeros(len(chunk), dtype=torch.bool, device=device)
            for _ in range(n_new):
                logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[:, -1]  # [b, V]
                nxt = logits.argmax(-1)
                x = torch.cat([x, nxt[:, None]], dim=1)
                done |= torch.isin(nxt, torch.tensor(sorted(stop_ids), device=device))
                if bool(done.all()):
                    break
            for row, i in enumerate(chunk):
                gen = x[row, len(prompts[i]) :].tolist()
                cut = next((j for j, t in enumerate(gen) if t in stop_ids), len(gen))
                out[i] = gen[:cut]
    return out


def _starts_with_word(text: str, answer: str) -> bool:
    want = " " + answer
    return text.startswith(want) and not (len(text) > len(want) and text[len(want)].isalpha())


def evaluate(model, tok, ev: dict, device, stop_ids: set[int], sets: tuple[str, ...] | None = None) -> dict:
    """Accuracies per evaluation set plus every wrong answer (set, prompt, expected, got)."""
    model.eval()
    results: dict[str, dict] = {}
    wrong: list[dict] = []
    names = sets or ("plain", "long_plain", "counting_heldout", "chat_heldout", "chat_new_phrasing")
    for name in names:
        items = ev[name]
        chat = name.startswith("chat")
        ids = [tok.encode(it["prompt"], add_special_tokens=False) for it in items]
        n_new = CHAT_NEW if chat or name == "counting_heldout" else PLAIN_NEW
        gens = greedy_batch(model, ids, n_new, stop_ids, device)
        texts = [tok.decode(g) for g in gens]
        if chat:
            exact = [t.strip() == it["expected"] for t, it in zip(texts, items)]
            contains = [re.search(rf"(?<!\w){re.escape(it['answer'])}(?!\w)", t) is not None for t, it in zip(texts, items)]
            results[name] = {"n": len(items), "exact": sum(exact) / len(items), "contains": sum(contains) / len(items)}
            ok = contains
        elif name == "counting_heldout":
            ok = [t.startswith(it["answer"]) for t, it in zip(texts, items)]
            results[name] = {"n": len(items), "accuracy": sum(ok) / len(items)}
        else:
            ok = [_starts_with_word(t, it["answer"]) for t, it in zip(texts, items)]
            results[name] = {"n": len(items), "accuracy": sum(ok) / len(items)}
            by_attr: dict[str, list[bool]] = defaultdict(list)
            for o, it in zip(ok, items):
                by_attr[it["attribute"]].append(o)
            results[name]["by_attribute"] = {a: sum(v) / len(v) for a, v in sorted(by_attr.items())}
        for o, t, it in zip(ok, texts, items):
            if not o:
                wrong.append({"set": name, "prompt": it["prompt"], "expected": it.get("expected", it["answer"]), "got": t})
    return {"results": results, "wrong": wrong}
