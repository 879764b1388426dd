"""Reference logits, greedy continuations and top-k decision gaps from the HF models.

Compute: the HF model is cast to float64 and run with `use_cache=False` over prompt+continuation;
logits are stored as float32. HF keeps some islands in float32 even then (RMSNorm, RoPE
cos/sin, the attention softmax, the MoE router and the DSA indexer scores); see README.

Decisions: every `torch.topk` HF makes during a forward is recorded through a TorchFunctionMode
and classified by its call site:
- `moe_group`  (router, scores per group `[T, n_group]`, k = topk_group),
- `moe_expert` (router, scores per expert `[T, E]` with non-selected groups masked, k = top_k),
- `dsa_index`  (indexer, `index_scores [1, S, S]` causal-masked, k = min(index_topk, S)),
- the router's in-group top-2 sum (3-D input) is not a decision (only the sum is used).
For each row with more valid candidates than k: gap = s[k-1] - s[k] of the sorted valid scores,
rel_gap = gap / max|valid scores of the row|. Masked entries (< -1e30) are not candidates.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

MASKED = -1e30


class TopkRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, torch.Tensor, int, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.topk, torch.Tensor.topk):
            inp = args[0]
            k = args[1] if len(args) > 1 else kwargs["k"]
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            site = "?"
            f = sys._getframe(1)
            while f is not None:
                if "transformers/models" in f.f_code.co_filename:
                    site = f.f_code.co_qualname
                    break
                f = f.f_back
            self.calls.append((site, inp.detach().to(torch.float64).clone(), int(k), int(dim)))
        return func(*args, **kwargs)


def classify(site: str, inp: torch.Tensor, cfg) -> str | None:
    if site.endswith("TopkRouter.forward"):
        if inp.dim() == 3:
            return None
        if inp.shape[-1] == cfg.n_routed_experts:
            return "moe_expert"
        if inp.shape[-1] == (cfg.n_group or 1):
            return "moe_group"
    if site.endswith("Indexer.forward"):
        return "dsa_index"
    raise RuntimeError(f"unexpected topk call from {site} with input shape {tuple(inp.shape)}")


def row_gaps(values: torch.Tensor, k: int, dim: int) -> list[tuple[int, float, float]]:
    """(row, gap, rel_gap) for every row that is a real decision."""
    v = values.movedim(dim, -1).reshape(-1, values.shape[dim])
    out = []
    for r in range(v.shape[0]):
        row = v[r]
        valid = row[row > MASKED]
        if valid.numel() <= k:
            continue
        s = torch.sort(valid, descending=True).values
        gap = float(s[k - 1] - s[k])
        scale = float(valid.abs().max())
        out.append((r, gap, gap / scale if scale > 0 else 0.0))
    return out


def decisions(calls, cfg) -> list[dict]:
    res = []
    layer_count: dict[str, int] = {}
    for site, inp, k, dim in calls:
        kind = classify(site, inp, cfg)
        if kind is None:
            continue
        idx = layer_count.get(kind, 0)
        layer_count[kind] = idx + 1
        for row, gap, rel in row_gaps(inp, k, dim):
            res.append({"kind": kind, "call": idx, "row": row, "k": k, "gap": gap, "rel_gap": rel})
    return res


@torch.no_grad()
def forward_logits(model, ids: list[int], record: bool = False):
    x = torch.tensor([ids], dtype=torch.long)
    if record:
        with TopkRecorder() as rec:
            out = model(input_ids=x, use_cache=False)
        return out.logits[0].to(torch.float64).numpy(), rec.calls
    return model(input_ids=x, use_cache=False).logits[0].to(torch.float64).numpy(), []


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    """HF generate, no sampling, EOS ignored (eos_token_id=None) so exactly n tokens come back."""
    x = torch.tensor([ids], dtype=torch.long)
    out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=n,
        min_new_tokens=0,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    new = out[0, len(ids) :].tolist()
    if len(new) != n:
        raise RuntimeError(f"generate returned {len(new)} tokens, wanted {n}")
    return new


def softmax_scale(cfg) -> float:
    base = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    rp = cfg.rope_parameters
    if rp.get("rope_type", "default") == "default":
        return base
    factor, m_all = float(rp["factor"]), float(rp.get("mscale_all_dim") or 0.0)
    mscale = 1.0 if factor <= 1 or not m_all else 0.1 * m_all * math.log(factor) + 1.0
    return base * mscale * mscale


def attention_modules(model):
    return [m for m in model.modules() if hasattr(m, "kv_b_proj") and hasattr(m, "scaling")]


def patch_softmax_scale(model, cfg) -> dict:
    """Sets every attention's `scaling` to qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2
    (DeepSeek / vLLM / llama.cpp semantics) and reports what HF had."""
    want = softmax_scale(cfg)
    attns = attention_modules(model)
    if len(attns) != cfg.num_hidden_layers:
        raise RuntimeError(f"found {len(attns)} attention modules, expected {cfg.num_hidden_layers}")
    hf_default = attns[0].scaling
    for a in attns:
        a.scaling = want
    return {"softmax_scale": want, "hf_default_scaling": hf_default, "hf_default_equal": abs(hf_default - want) < 1e-15}


def scale_effect(model, cfg, ids: list[int]) -> float:
    """Max |logit change| when the mscale^2 factor is dropped: proves the patched value is used."""
    want = softmax_scale(cfg)
    plain = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    attns = attention_modules(model)
    a, _ = forward_logits(model, ids)
    for m in attns:
        m.scaling = plain
    b, _ = forward_logits(model, ids)
    for m in attns:
        m.scaling = want
    return float(np.abs(a - b).max())


def dsa_effect(model, ids: list[int]) -> float | None:
    """Max |logit change| when every indexer selects all keys (dense MLA): proves the top-k
    mask is applied and that index_topk < len(ids) really sparsifies. None without an indexer."""
    idx = [m for m in model.modules() if hasattr(m, "index_topk") and hasattr(m, "wq_b")]
    if not idx:
        return None
    a, _ = forward_logits(model, ids)
    saved = [m.index_topk for m in idx]
    for m in idx:
        m.index_topk = 1 << 30
    b, _ = forward_logits(model, ids)
    for m, k in zip(idx, saved):
        m.index_topk = k
    return float(np.abs(a - b).max())


def argmax_margins(logits: np.ndarray, rows: range) -> list[float]:
    out = []
    for r in rows:
        s = np.sort(logits[r])[::-1]
        out.append(float((s[0] - s[1]) / np.abs(logits[r]).max()))
    return out


def run_variant(model64, cfg, prompts: dict[str, list[int]], n_greedy: int) -> dict:
    """Greedy continuation, full-sequence logits and decision gaps for every prompt."""
    res = {}
    for pname, ids in prompts.items():
        cont = greedy(model64, ids, n_greedy)
        full = ids + cont[:-1]
        logits, calls = forward_logits(model64, full, record=True)
        # The cached generate path and the uncached full forward must agree; they can only
        # disagree through a near-tie, which the gap check then rejects.
        argmax = [int(np.argmax(logits[r])) for r in range(len(ids) - 1, len(full))]
        dec = decisions(calls, cfg)
        res[pname] = {
            "prompt": ids,
            "greedy": cont,
            "logits": logits.astype(np.float32),
            "decisions": dec,
            "argmax_margins": argmax_margins(logits, range(len(ids) - 1, len(full))),
            "generate_matches_full_forward": argmax == cont,
        }
    return res


def summarize(variant_res: dict) -> dict:
    by_kind: dict[str, dict] = {}
    margins = []
    for pres in variant_res.values():
        margins += pres["argmax_margins"]
        for d in pres["decisions"]:
            s = by_kind.setdefault(d["kind"], {"count": 0, "min_rel_gap": math.inf, "min_gap": math.inf})
            s["count"] += 1
            s["min_rel_gap"] = min(s["min_rel_gap"], d["rel_gap"])
            s["min_gap"] = min(s["min_gap"], d["gap"])
    worst = min([s["min_rel_gap"] for s in by_kind.values()] + [math.inf])
    return {
        "generate_matches_full_forward": all(p["generate_matches_full_forward"] for p in variant_res.values()),
        "decisions": by_kind,
        "min_rel_gap": worst,
        "min_argmax_rel_margin": min(margins) if margins else math.inf,
    }
