#!/usr/bin/env python3
"""Trains the demo `GlmMoeDsaForCausalLM` (transformers 5.24) on the tokenized corpus.

    python tools/demo_model/train.py --data .device/demo --out OUT [--steps N]

Reads `tokens.npz`, `eval.json`, `tokenizer/` from --data and every setting from
recipe.py. Writes to --out: `model.safetensors` (float32 state dict incl. the routers'
`e_score_correction_bias` buffers), `train_log.json` (settings, steps, losses, timings, sha256) and
`eval_train.json` (accuracy.py on the float32 weights and on the
weights rounded as the BF16 GGUF stores them).

Training (invariants):
- loss = LM cross-entropy on every non-pad position + indexer_kl_weight * indexer KL;
- DSA indexer (DeepSeek-V3.2 recipe): HF runs the indexer under no_grad, so its weights learn only
  from a KL loss between the main attention distribution (summed over heads, L1-normalised,
  detached) and softmax(index scores), computed from detached indexer inputs with a replica of
  `GlmMoeDsaIndexer.forward` (its top-k is compared with HF's own selection, and the share of
  dense attention mass the selection keeps is measured: `indexer_diagnostics`). First
  `dense_warmup_frac` of the steps: dense attention (index_topk = inf) and KL over all causal keys;
  then sparse attention with index_topk = 32 and KL over the selected keys only;
- MoE load balance without aux loss (DeepSeek-V3): after each step every router's
  e_score_correction_bias moves by bias_update_rate * sign(mean load - expert load), counted over
  non-pad tokens;
- batches: documents right-padded (pad positions get label -100 and are causally invisible to real
  ones), length-bucketed; every document starts at position 0;
- experts implementation: HF's `grouped_mm` if its loss and gradients match `eager` (rtol 1e-3) on
  one batch and it is faster in the timing probe, else `eager` (recorded in train_log.json); the
  step count is min(max_steps, time_budget_s / probe time) rounded down to 100, unless --steps.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import recipe  # noqa: E402
from accuracy import evaluate  # noqa: E402

NEG = -1e9


def build_config(special: dict):
    from transformers import GlmMoeDsaConfig

    return GlmMoeDsaConfig(**recipe.MODEL, bos_token_id=None, eos_token_id=special["eos_token_id"],
                           pad_token_id=special["pad_token_id"])


def build_model(cfg, seed: int):
    from transformers import GlmMoeDsaForCausalLM

    torch.manual_seed(seed)
    model = GlmMoeDsaForCausalLM(cfg).to(torch.float32)
    model.set_attn_implementation("eager")  # the index mask and the attention weights need eager
    model.set_experts_implementation("eager")
    return model


class Batches:
    """Endless deterministic stream of (input_ids [B, S], labels [B, S], lengths [B])."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, batch_docs: int, bucket_batches: int, seed: int, pad_id: int):
        self.tokens, self.offsets = tokens, offsets
        self.lengths = np.diff(offsets)
        self.b, self.window = batch_docs, batch_docs * bucket_batches
        self.rng = np.random.default_rng(seed)
        self.pad = pad_id

    def __iter__(self):
        while True:
            perm = self.rng.permutation(len(self.lengths))
            for w in range(0, len(perm), self.window):
                win = perm[w : w + self.window]
                win = win[np.argsort(self.lengths[win], kind="stable")]
                batches = [win[i : i + self.b] for i in range(0, len(win), self.b) if len(win[i : i + self.b]) == self.b]
                for j in self.rng.permutation(len(batches)):
                    yield self.make(batches[j])

    def make(self, docs: np.ndarray):
        lens = self.lengths[docs]
        s = int(lens.max())
        ids = np.full((len(docs), s), self.pad, dtype=np.int64)
        for r, d in enumerate(docs):
            ids[r, : lens[r]] = self.tokens[self.offsets[d] : self.offsets[d + 1]]
        x = torch.from_numpy(ids)
        labels = x.clone()
        labels[torch.arange(s)[None, :] >= torch.from_numpy(lens)[:, None]] = -100
        return x, labels, torch.from_numpy(lens)


class Probe:
    """Forward hooks that keep, per layer, what the indexer loss and the bias update need."""

    def __init__(self, model) -> None:
        self.layers = model.model.layers
        self.data: list[dict] = [{} for _ in self.layers]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            attn.register_forward_pre_hook(self._pre(i), with_kwargs=True)
            attn.q_a_layernorm.register_forward_hook(self._keep(i, "q_resid"))
            attn.register_forward_hook(self._post(i))
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(self._router(i))

    def _pre(self, i):
        def hook(_mod, args, kwargs):
            hs = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            self.data[i]["x"] = hs.detach()
            self.data[i]["pe"] = tuple(t.detach() for t in kwargs["position_embeddings"])

        return hook

    def _keep(self, i, key):
        def hook(_mod, _inp, out):
            self.data[i][key] = out.detach()

        return hook

    def _post(self, i):
        def hook(_mod, _inp, out):
            self.data[i]["attn"] = out[1].detach()  # [B, H, S, S] softmax probabilities
            self.data[i]["topk"] = out[2]  # [B, S, k] int32

        return hook

    def _router(self, i):
        def hook(_mod, _inp, out):
            self.data[i]["experts"] = out[2].detach()  # [B*S, top_k]

        return hook


def indexer_logits(idx, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GlmMoeDsaIndexer.forward's index scores [B, S, S] (float32, before masking), with gradients."""
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave

    b, s, _ = x.shape
    rope = idx.qk_rope_head_dim
    q = idx.wq_b(q_resid).view(b, s, idx.n_heads, idx.head_dim)  # [B, S, Hi, D]
    q_rot, q_pass = torch.split(q, [rope, idx.head_dim - rope], dim=-1)
    k = idx.k_norm(idx.wk(x)).unsqueeze(2)  # [B, S, 1, D]
    k_rot, k_pass = torch.split(k, [rope, idx.head_dim - rope], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)  # [B, S, D]
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * idx.softmax_scale)  # [B, S, Hi, S]
    w = idx.weights_proj(x.to(idx.weights_proj.weight.dtype)).float() * (idx.n_heads**-0.5)  # [B, S, Hi]
    return torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)  # [B, S, S]


def indexer_kl(logits, attn, topk, valid: torch.Tensor, sparse: bool) -> torch.Tensor:
    """Mean over valid query rows of KL(attention mass over heads || softmax(index scores))."""
    b, s, _ = logits.shape
    allowed = torch.ones(s, s, dtype=torch.bool, device=logits.device).tril().expand(b, s, s)
    if sparse:
        allowed = allowed & torch.zeros_like(allowed).scatter(-1, topk.long(), True)
    target = attn.float().sum(1).masked_fill(~allowed, 0.0)
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-12)
    logp = logits.masked_fill(~allowed, NEG).log_softmax(-1)
    kl = (target * (target.clamp_min(1e-12).log() - logp)).masked_fill(~allowed, 0.0).sum(-1)  # [B, S]
    v = valid.to(kl.dtype)
    return (kl * v).sum() / v.sum()


@torch.no_grad()
def indexer_diagnostics(model, probe: Probe, batch, device, cfg, rel_tol: float = 1e-4) -> dict:
    """On one batch: (a) `replica_mismatch`: fraction of query rows where the replica's causal
    top-k values differ from those at HF's selected keys (beyond rel_tol of the row scale; ties at
    the boundary are fine); (b) `recall`: mean share of the DENSE attention mass (mean over heads)
    that falls on the indexer's top-index_topk keys, over query rows t >= index_topk."""
    x, _, lens = (v.to(device) for v in batch)
    was_training = model.training
    model.eval()
    set_index_topk(model, 1 << 30)
    model(input_ids=x, use_cache=False)
    dense = [probe.data[i]["attn"].mean(1) for i in range(len(model.model.layers))]  # [B, S, S] each
    set_index_topk(model, cfg.index_topk)
    model(input_ids=x, use_cache=False)
    model.train(was_training)
    s = x.shape[1]
    valid = torch.arange(s, device=device)[None, :] < lens[:, None]
    far = valid & (torch.arange(s, device=device)[None, :] >= cfg.index_topk)
    causal = torch.ones(s, s, dtype=torch.bool, device=device).tril()
    mismatch, recall = [], []
    for i, layer in enumerate(model.model.layers):
        d = probe.data[i]
        lg = indexer_logits(layer.self_attn.indexer, d["x"], d["q_resid"], *d["pe"]).masked_fill(~causal, NEG)
        k = d["topk"].shape[-1]
        hf_vals = torch.gather(lg, -1, d["topk"].long()).sort(-1).values
        my_vals = lg.topk(k, dim=-1).values.sort(-1).values
        scale = lg.masked_fill(~causal, 0).abs().amax(-1, keepdim=True).clamp_min(1e-12)
        bad = ((hf_vals - my_vals).abs() > rel_tol * scale).any(-1) & valid
        mismatch.append(float(bad.sum() / valid.sum()))
        sel = torch.zeros_like(causal.expand_as(lg)).scatter(-1, d["topk"].long(), True) & causal
        mass = (dense[i] * sel).sum(-1)  # [B, S]
        recall.append(float(mass[far].mean()) if bool(far.any()) else float("nan"))
    return {"replica_mismatch": mismatch, "recall": recall, "rows_far": int(far.sum())}


def bf16_as_gguf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights as `convert_hf_to_gguf.py --outtype bf16` stores them: round-to-nearest-even
    bfloat16 except 1-D tensors, the router (`ffn_gate_inp`) and the indexer's `weights_proj`
    (`indexer.proj`), which stay float32. make_demo.py checks this is bit-identical to the GGUF."""
    out = {}
    for k, v in state.items():
        keep = v.dim() < 2 or k.endswith("mlp.gate.weight") or k.endswith("indexer.weights_proj.weight")
        out[k] = v if keep else v.to(torch.bfloat16).to(torch.float32)
    return out


def set_index_topk(model, k: int) -> None:
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = k


def lr_at(step: int, total: int, t: dict) -> float:
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    p = (step - t["warmup_steps"]) / max(1, total - t["warmup_steps"])
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * min(1.0, p)))


def make_optimizer(model, t: dict):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t["lr"], betas=t["betas"], fused=torch.cuda.is_available())


def train_step(model, probe, opt, batch, step, total, t, dense_steps, device, cfg, stats=None):
    x, labels, lens = (v.to(device, non_blocking=True) for v in batch)
    sparse = step >= dense_steps
    set_index_topk(model, cfg.index_topk if sparse else 1 << 30)
    for g in opt.param_groups:
        g["lr"] = lr_at(step, total, t)
    out = model(input_ids=x, labels=labels, use_cache=False)
    valid = torch.arange(x.shape[1], device=device)[None, :] < lens[:, None]  # [B, S]
    kls = []
    for i, layer in enumerate(model.model.layers):
        d = probe.data[i]
        lg = indexer_logits(layer.self_attn.indexer, d["x"], d["q_resid"], *d["pe"])
        kls.append(indexer_kl(lg, d["attn"], d["topk"], valid, sparse))
    kl = torch.stack(kls).mean()
    loss = out.loss + t["indexer_kl_weight"] * kl
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
    opt.step()
    with torch.no_grad():
        vflat = valid.reshape(-1)
        for i, layer in enumerate(model.model.layers):
            if "experts" not in probe.data[i]:
                continue
            gate = layer.mlp.gate
            load = torch.bincount(probe.data[i]["experts"][vflat].reshape(-1), minlength=gate.num_experts).float()
            gate.e_score_correction_bias += t["bias_update_rate"] * torch.sign(load.mean() - load)
            if stats is not None:
                stats.setdefault(i, torch.zeros_like(load))
                stats[i] += load
    return out.loss, kl, gnorm, sparse


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def timing_probe(model, cfg, t, data, device, impl: str, n: int = 16) -> float:
    """Seconds per training step with experts implementation `impl`, measured on a throw-away
    copy (the real run is untouched)."""
    m = copy.deepcopy(model)
    m.set_experts_implementation(impl)
    probe = Probe(m)
    opt = make_optimizer(m, t)
    it = iter(Batches(*data, t["batch_docs"], t["bucket_batches"], t["seed"] + 1, cfg.pad_token_id))
    times = []
    for s in range(n):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.time()
        train_step(m, probe, opt, next(it), s, n, t, n // 2, device, cfg)  # half dense, half sparse
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.time() - t0)
    del m, opt
    return float(np.mean(times[4:]))


def same_gradients(model, batch, device, impl: str) -> str | None:
    """None if experts implementation `impl` gives the eager loss and gradients (rtol 1e-3), else why not."""
    x, labels, _ = (v.to(device) for v in batch)
    grads = {}
    try:
        for name in ("eager", impl):
            m = copy.deepcopy(model)
            m.set_experts_implementation(name)
            loss = m(input_ids=x, labels=labels, use_cache=False).loss
            loss.backward()
            grads[name] = (float(loss.detach()), {k: p.grad.detach().clone() for k, p in m.named_parameters() if p.grad is not None})
            del m
    except Exception as e:  # noqa: BLE001 - any failure means "do not use this implementation"
        return f"{type(e).__name__}: {e}"
    (le, ge), (li, gi) = grads["eager"], grads[impl]
    if abs(le - li) > 1e-4 * abs(le) or ge.keys() != gi.keys():
        return f"loss {li} != eager {le}"
    for k in ge:
        tol = 1e-3 * float(ge[k].abs().max()) + 1e-8
        if float((ge[k] - gi[k]).abs().max()) > tol:
            return f"gradient of {k} differs from eager"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, help="fixed step count (skips the timing probe)")
    ap.add_argument("--batch-docs", type=int, help="override recipe batch_docs (smoke tests only)")
    ap.add_argument("--eval-limit", type=int, help="evaluate only the first N items per set (smoke tests)")
    args = ap.parse_args()
    t = dict(recipe.TRAIN)
    if args.batch_docs:
        t["batch_docs"] = args.batch_docs
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # plain float32 everywhere (the model is tiny)
    torch.backends.cudnn.allow_tf32 = False
    import transformers
    from transformers import AutoTokenizer

    special = json.loads((args.data / "tokenizer" / "special_ids.json").read_text())
    cfg = build_config(special)
    with np.load(args.data / "tokens.npz") as z:
        data = (z["tokens"], z["offsets"])
    model = build_model(cfg, t["seed"]).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {device}, params {n_params}", flush=True)

    probe_batch = next(iter(Batches(*data, 32, 1, t["seed"] + 2, cfg.pad_token_id)))
    impl_check = {"grouped_mm": same_gradients(model, probe_batch, device, "grouped_mm")}
    candidates = ["eager"] + [k for k, v in impl_check.items() if v is None]
    print(f"experts implementations: {impl_check}", flush=True)
    t_probe = None
    if args.steps:
        steps, impl = args.steps, candidates[-1]
    else:
        t_probe = {c: timing_probe(model, cfg, t, data, device, c) for c in candidates}
        impl = min(t_probe, key=t_probe.get)
        steps = min(t["max_steps"], int(t["time_budget_s"] / t_probe[impl]) // 100 * 100)
        print(f"timing probe (s/step): {t_probe} -> {impl}, {steps} steps", flush=True)
    model.set_experts_implementation(impl)
    dense_steps = int(round(t["dense_warmup_frac"] * steps))

    probe = Probe(model)
    opt = make_optimizer(model, t)
    it = iter(Batches(*data, t["batch_docs"], t["bucket_batches"], t["seed"], cfg.pad_token_id))
    log, acc, t0 = [], {"lm": 0.0, "kl": 0.0, "n": 0}, time.time()  # lm/kl accumulate on the device
    loads: dict[int, torch.Tensor] = {}
    diag_it = iter(Batches(*data, 64, 1, t["seed"] + 3, cfg.pad_token_id))
    diag_batch = max((next(diag_it) for _ in range(40)), key=lambda b: b[0].shape[1])  # a long batch
    diag = {"initial": indexer_diagnostics(model, probe, diag_batch, device, cfg)}
    model.train()
    for step in range(steps):
        lm, kl, gnorm, sparse = train_step(model, probe, opt, next(it), step, steps, t, dense_steps, device, cfg, loads)
        if step + 1 == dense_steps:
            diag["end_of_dense"] = indexer_diagnostics(model, probe, diag_batch, device, cfg)
            print("indexer", json.dumps(diag["end_of_dense"]), flush=True)
        acc["lm"] += lm.detach()
        acc["kl"] += kl.detach()
        acc["n"] += 1
        if (step + 1) % t["log_every"] == 0 or step + 1 == steps:
            row = {"step": step + 1, "lm_loss": float(acc["lm"]) / acc["n"], "indexer_kl": float(acc["kl"]) / acc["n"],
                   "grad_norm": float(gnorm), "lr": lr_at(step, steps, t), "sparse": sparse, "elapsed_s": time.time() - t0}
            log.append(row)
            print(json.dumps(row), flush=True)
            acc = {"lm": 0.0, "kl": 0.0, "n": 0}
    train_s = time.time() - t0
    diag["final"] = indexer_diagnostics(model, probe, diag_batch, device, cfg)
    print("indexer", json.dumps(diag["final"]), flush=True)

    model.eval()
    tok = AutoTokenizer.from_pretrained(args.data / "tokenizer")
    ev = json.loads((args.data / "eval.json").read_text(encoding="utf-8"))
    if args.eval_limit:
        ev = {k: v[: args.eval_limit] if isinstance(v, list) else v for k, v in ev.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    bias = {f"layer{i}": layer.mlp.gate.e_score_correction_bias.tolist() for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")}
    share = {f"layer{i}": (v / v.sum()).tolist() for i, v in loads.items()}
    (args.out / "train_log.json").write_text(json.dumps({
        "recipe_train": t, "steps": steps, "dense_steps": dense_steps, "timing_probe_s_per_step": t_probe,
        "experts_implementation": impl, "experts_implementation_check": impl_check, "indexer_diagnostics": diag,
        "train_seconds": train_s, "n_params": n_params, "device": str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "final": log[-1] if log else None, "log": log, "router_bias": bias, "expert_load_share": share,
        "model_safetensors_sha256": sha256(args.out / "model.safetensors"),
    }, indent=1) + "\n")
    evals = {}
    for name, weights in (("float32", None), ("gguf_bf16", bf16_as_gguf(state))):
        if weights is not None:
            model.load_state_dict({k: v.to(device) for k, v in weights.items()})
        t1 = time.time()
        evals[name] = evaluate(model, tok, ev, device, set(special["eos_token_id"]))
        evals[name]["eval_s"] = time.time() - t1
        print(name, json.dumps(evals[name]["results"]), flush=True)
        (args.out / "eval_train.json").write_text(json.dumps(evals, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

if __name__ == "__main__":
    main()
