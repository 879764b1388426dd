"""Dump an HF MLA checkpoint's intermediate tensors under the engine's probe names.

    python tools/hf_dump.py --model DIR --tokens 0,5,9 --out dump.safetensors
    python tools/hf_dump.py --model DIR --prompts-json reference.json --prompt len13 --out dump.safetensors

Runs `AutoModelForCausalLM` (DeepseekV2/V3ForCausalLM, GlmMoeDsaForCausalLM) once over the ids
(batch 1, positions 0..T-1, eager attention, eager experts, use_cache=False, float32 compute by
default) and writes one safetensors file (float32 unless noted) that `mlaserve doctor --reference`
compares with the engine's own probes (crates/model/src/probe.rs names, dump.rs layout):

  L{i}.attn_norm        [T, H]      input_layernorm output
  L{i}.mla.q_nope       [T, N, P]   q (q_b_proj or q_proj output), nope part
  L{i}.mla.q_pe         [T, N, R]   q rope part AFTER rope, in the checkpoint's (interleaved) order
  L{i}.mla.kv_c_normed  [T, L]      kv_a_layernorm output
  L{i}.mla.k_pe         [T, R]      k rope part AFTER rope, checkpoint order
  L{i}.mla.attn_out     [T, N, V]   attention output before o_proj (o_proj's input)
  L{i}.mla.o_proj       [T, H]      o_proj output
  L{i}.moe.out          [T, H]      MoE layers: routed + shared experts
  L{i}.mlp.out          [T, H]      dense layers
  L{i}.out              [T, H]      residual stream after the layer
  logits                [T, vocab]
  positions, tokens     int64 [T]   (doctor reruns `tokens`)

RoPE order: HF's `apply_rotary_pos_emb_interleave` (V3, GLM) rotates the interleaved pairs
(2i, 2i+1) but writes its output de-interleaved (rotated evens, then rotated odds) into q and k,
which leaves every q.k unchanged. The engine rotates in place, so the dump un-permutes HF's
output back to interleaved order: dumped[2i] = hf[i], dumped[2i+1] = hf[R/2 + i]. V2's
`apply_rotary_emb` (complex pairs) and split-half `apply_rotary_pos_emb` keep the checkpoint order.

The post-rope tensors are HF's own: the modelling module's rope function is wrapped for the
duration of the run (DSA indexer calls excluded); everything else comes from forward hooks.
Self-checks (all must pass, else the dump is not written):
  - dumped q_pe / k_pe equal an independent float64 interleaved rotation of the pre-rope rows;
  - every q_pe.k_pe dot product is the same in HF's order and in the dumped order;
  - attn_out recomputed from the dumped q_nope, q_pe, kv_c_normed, k_pe, kv_b_proj and the
    softmax scale (causal, plus the DSA top-k selection HF used) matches HF's attn_out.
The softmax scale is set to qk_head_dim^-0.5 * mscale^2 (fixturegen.reference; transformers 5.24
already uses this value, the dump's metadata says whether it had to be changed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from fixturegen import reference  # noqa: E402

# rope function name in the modelling module -> order of its rotated output
ROPE_FNS = {
    "apply_rotary_pos_emb_interleave": "deinterleaved",  # V3 / GLM with rope_interleave: un-permute
    "apply_rotary_emb": "checkpoint",  # V2: complex adjacent pairs, in place
    "apply_rotary_pos_emb": "checkpoint",  # split-half rope on split-half weights
}


def reinterleave(x: torch.Tensor) -> torch.Tensor:
    """[.., R] in HF's de-interleaved order (evens then odds) -> interleaved pairs."""
    r = x.shape[-1]
    return torch.stack([x[..., : r // 2], x[..., r // 2 :]], dim=-1).reshape(x.shape)


class Recorder:
    """Forward hooks on every decoder layer + a wrapper on the modelling module's rope function."""

    def __init__(self, model) -> None:
        self.model = model
        self.cfg = model.config
        self.layers = model.model.layers
        self.rec: dict[str, torch.Tensor] = {}
        self.rope: dict[int, tuple] = {}  # layer -> (q_out [B,N,T,R], k_out [B,1,T,R], order)
        self.topk: dict[int, torch.Tensor] = {}
        self.layer: int | None = None
        self.in_indexer = False
        self.handles: list = []
        self.patched: list[tuple[object, str, object]] = []  # (module, name, original)

    def put(self, name: str, x: torch.Tensor) -> None:
        if name in self.rec:
            raise RuntimeError(f"probe {name} captured twice (a module ran twice?)")
        self.rec[name] = x.detach()[0].clone()  # drop batch

    def _on_rope(self, q, k, qo, ko, order: str) -> None:
        if self.layer is None or self.in_indexer or self.layer in self.rope:
            return
        self.rope[self.layer] = (qo.detach().clone(), ko.detach().clone(), order)

    def __enter__(self) -> Recorder:
        try:
            return self._install()
        except BaseException:
            self.__exit__()
            raise

    def _install(self) -> Recorder:
        mod = sys.modules[type(self.layers[0].self_attn).__module__]
        for name, order in ROPE_FNS.items():
            fn = getattr(mod, name, None)
            if fn is None:
                continue

            def wrapped(q, k, *a, _fn=fn, _order=order, **kw):
                qo, ko = _fn(q, k, *a, **kw)
                self._on_rope(q, k, qo, ko, _order)
                return qo, ko

            self.patched.append((mod, name, fn))
            setattr(mod, name, wrapped)
        if not self.patched:
            raise RuntimeError(f"{mod.__name__}: no known rope function ({', '.join(ROPE_FNS)})")
        hook = lambda m, f: self.handles.append(m.register_forward_hook(f))  # noqa: E731
        for i, layer in enumerate(self.layers):
            at = layer.self_attn
            hook(layer.input_layernorm, lambda m, a, o, i=i: self.put(f"L{i}.attn_norm", o))
            self.handles.append(at.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "layer", i)))
            hook(at, lambda m, a, o: setattr(self, "layer", None))
            q_mod = at.q_b_proj if getattr(at, "q_b_proj", None) is not None else at.q_proj
            hook(q_mod, lambda m, a, o, i=i: self.put(f"L{i}.q_raw", o))
            hook(at.kv_a_proj_with_mqa, lambda m, a, o, i=i: self.put(f"L{i}.kv_raw", o))
            hook(at.kv_a_layernorm, lambda m, a, o, i=i: self.put(f"L{i}.mla.kv_c_normed", o))
            self.handles.append(
                at.o_proj.register_forward_pre_hook(lambda m, a, i=i: self.put(f"L{i}.mla.attn_out", a[0]))
            )
            hook(at.o_proj, lambda m, a, o, i=i: self.put(f"L{i}.mla.o_proj", o))
            idx = getattr(at, "indexer", None)
            if idx is not None:
                self.handles.append(idx.register_forward_pre_hook(lambda m, a: setattr(self, "in_indexer", True)))

                def idx_done(m, a, o, i=i):
                    self.in_indexer = False
                    self.topk[i] = o.detach()[0].clone()  # [T, topk]

                hook(idx, idx_done)
            kind = "moe" if hasattr(layer.mlp, "experts") else "mlp"
            hook(layer.mlp, lambda m, a, o, i=i, kind=kind: self.put(f"L{i}.{kind}.out", o))
            hook(layer, lambda m, a, o, i=i: self.put(f"L{i}.out", o[0] if isinstance(o, tuple) else o))
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        for mod, name, fn in self.patched:
            setattr(mod, name, fn)
        self.handles, self.patched = [], []


def save_safetensors(tensors: dict[str, torch.Tensor], out: Path, meta: dict[str, str]) -> None:
    """safetensors file with a reproducible header (the library's writer orders `__metadata__`
    through a hash map, so its bytes change from run to run): tensors by name, keys sorted,
    header padded with spaces to 8 bytes, little-endian data."""
    dtypes = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}
    header: dict = {"__metadata__": dict(sorted(meta.items()))}
    blobs, off = [], 0
    for name in sorted(tensors):
        x = tensors[name].contiguous()
        if x.dtype not in dtypes:
            raise ValueError(f"{name}: dtype {x.dtype} not supported by the dump writer")
        tag, np_dtype = dtypes[x.dtype]
        b = x.numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": tag, "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as fh:
        fh.write(len(h).to_bytes(8, "little"))
        fh.write(h)
        for b in blobs:
            fh.write(b)


def load(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.set_attn_implementation("eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model.to(dtype).eval()


def rope_checks(rc: Recorder, probes: dict[str, torch.Tensor], t: int) -> dict:
    """Independent interleaved rotation and q.k invariance (float64)."""
    cfg = rc.cfg
    n, p, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    rot = rc.model.model.rotary_emb
    ang = torch.arange(t, dtype=torch.float64)[:, None] * rot.inv_freq.to(torch.float64)[None]  # [T, R/2]
    cos, sin = torch.cos(ang) * rot.attention_scaling, torch.sin(ang) * rot.attention_scaling
    interleaved = getattr(cfg, "rope_interleave", True) or cfg.model_type == "deepseek_v2"

    def rotate(x: torch.Tensor) -> torch.Tensor:  # x [T, ..., R] checkpoint order
        c = cos.view(t, *([1] * (x.dim() - 2)), -1)
        s = sin.view(t, *([1] * (x.dim() - 2)), -1)
        if interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * c - b * s, b * c + a * s], dim=-1).reshape(x.shape)
        a, b = x[..., : r // 2], x[..., r // 2 :]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    worst_rot, worst_dot = 0.0, 0.0
    for i in range(len(rc.layers)):
        q_hf, k_hf, _ = rc.rope[i]
        q_pre = probes.pop(f"L{i}.q_raw").view(t, n, p + r)[..., p:].to(torch.float64)
        k_pre = probes.pop(f"L{i}.kv_raw")[:, -r:].to(torch.float64)
        for want, got in ((rotate(q_pre), probes[f"L{i}.mla.q_pe"]), (rotate(k_pre), probes[f"L{i}.mla.k_pe"])):
            err = float((want - got.to(torch.float64)).abs().max() / want.abs().max())
            worst_rot = max(worst_rot, err)
        q_hf = q_hf[0].transpose(0, 1).to(torch.float64)  # [T, N, R]
        k_hf = k_hf[0, 0].to(torch.float64)  # [T, R]
        d_hf = torch.einsum("tnr,sr->nts", q_hf, k_hf)
        d_dump = torch.einsum(
            "tnr,sr->nts", probes[f"L{i}.mla.q_pe"].to(torch.float64), probes[f"L{i}.mla.k_pe"].to(torch.float64)
        )
        worst_dot = max(worst_dot, float((d_hf - d_dump).abs().max() / d_hf.abs().max()))
    return {"rope_vs_independent_rotation_max_rel": worst_rot, "qpe_kpe_dot_invariance_max_rel": worst_dot}


def attn_recompute_check(rc: Recorder, probes: dict[str, torch.Tensor], t: int) -> float:
    """Max relative error of attn_out recomputed from the dumped probes (float64)."""
    cfg = rc.cfg
    n, p, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    worst = 0.0
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i, layer in enumerate(rc.layers):
        at = layer.self_attn
        g = lambda k: probes[f"L{i}.mla.{k}"].to(torch.float64)  # noqa: E731
        w = at.kv_b_proj.weight.detach().to(torch.float64).view(n, p + v, -1)  # [N, P+V, L]
        kvc = g("kv_c_normed")  # [T, L]
        k_nope = torch.einsum("sl,nkl->nsk", kvc, w[:, :p])  # [N, S, P]
        val = torch.einsum("sl,nvl->nsv", kvc, w[:, p:])  # [N, S, V]
        s = torch.einsum("tnk,nsk->nts", g("q_nope"), k_nope) + torch.einsum("tnr,sr->nts", g("q_pe"), g("k_pe"))
        allowed = causal.clone()
        if i in rc.topk:
            sel = torch.zeros(t, t, dtype=torch.bool).scatter(1, rc.topk[i].long(), True)
            allowed &= sel
        s = (s * at.scaling).masked_fill(~allowed, float("-inf"))
        out = torch.einsum("nts,nsv->tnv", torch.softmax(s, dim=-1), val)
        want = g("attn_out")
        worst = max(worst, float((out - want).abs().max() / want.abs().max()))
    return worst


@torch.no_grad()
def dump(model_dir: Path, tokens: list[int], out: Path, dtype: str = "float32", threads: int = 1) -> dict:
    """Run, check, write `out`; returns the self-check numbers (also stored in the metadata)."""
    import transformers

    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir}: not an HF checkpoint directory (no config.json)")
    torch.set_num_threads(threads)
    tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]
    model = load(model_dir, tdtype)
    cfg = model.config
    if not tokens:
        raise ValueError("no token ids given")
    bad = [x for x in tokens if not 0 <= x < cfg.vocab_size]
    if bad:
        raise ValueError(f"token ids {bad} outside the vocabulary [0, {cfg.vocab_size})")
    scale = reference.patch_softmax_scale(model, cfg)
    t = len(tokens)
    ids = torch.tensor([tokens], dtype=torch.long)
    with Recorder(model) as rc:
        logits = model(input_ids=ids, use_cache=False).logits[0]
    missing = [i for i in range(len(rc.layers)) if i not in rc.rope]
    if missing:
        raise RuntimeError(f"rope call not seen in layers {missing}")
    probes = rc.rec
    n, r = cfg.num_attention_heads, cfg.qk_rope_head_dim
    for i in range(len(rc.layers)):
        q_out, k_out, order = rc.rope[i]
        q = q_out[0].transpose(0, 1)  # [B, N, T, R] -> [T, N, R]
        k = k_out[0, 0]  # [B, 1, T, R] -> [T, R]
        if tuple(q.shape) != (t, n, r) or tuple(k.shape) != (t, r):
            raise RuntimeError(f"layer {i}: unexpected rope shapes q {tuple(q_out.shape)} k {tuple(k_out.shape)}")
        if order == "deinterleaved":
            q, k = reinterleave(q), reinterleave(k)
        probes[f"L{i}.mla.q_pe"], probes[f"L{i}.mla.k_pe"] = q, k
        p = cfg.qk_nope_head_dim
        probes[f"L{i}.mla.q_nope"] = probes[f"L{i}.q_raw"].view(t, n, p + r)[..., :p]
        probes[f"L{i}.mla.kv_c_normed"] = probes[f"L{i}.mla.kv_c_normed"].reshape(t, -1)
        probes[f"L{i}.mla.attn_out"] = probes[f"L{i}.mla.attn_out"].reshape(t, n, cfg.v_head_dim)
    checks = rope_checks(rc, probes, t)
    checks["attn_out_recompute_max_rel"] = attn_recompute_check(rc, probes, t)
    tol = 1e-5  # float64 runs too: HF keeps rope cos/sin and the softmax in float32
    failed = {k: v for k, v in checks.items() if v > tol}
    if failed:
        raise RuntimeError(f"self-checks failed (tolerance {tol}): {failed}")
    probes["logits"] = logits
    tensors = {k: v.to(torch.float32).contiguous() for k, v in probes.items()}
    tensors["positions"] = torch.arange(t, dtype=torch.int64)
    tensors["tokens"] = torch.tensor(tokens, dtype=torch.int64)
    meta = {
        "producer": "tools/hf_dump.py",
        "model": model_dir.resolve().parent.name + "/" + model_dir.resolve().name,
        "architecture": type(model).__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "compute_dtype": dtype,
        "rope_order": "checkpoint (interleaved pairs (2i, 2i+1))"
        if getattr(cfg, "rope_interleave", True)
        else "checkpoint (split-half)",
        "softmax_scale": repr(scale["softmax_scale"]),
        "hf_default_scale_equal": str(scale["hf_default_equal"]).lower(),
        "self_checks": json.dumps(checks, sort_keys=True),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, out, meta)
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="HF checkpoint directory")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--prompts-json", type=Path, help="a fixture reference.json (with --prompt)")
    ap.add_argument("--prompt", help="prompt name in --prompts-json, e.g. len13")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: reproducible bytes)")
    args = ap.parse_args()
    if (args.tokens is None) == (args.prompts_json is None):
        ap.error("give exactly one of --tokens and --prompts-json/--prompt")
    if args.tokens is not None:
        try:
            tokens = [int(x) for x in args.tokens.split(",") if x.strip()]
        except ValueError as e:
            ap.error(f"--tokens: {e}")
    else:
        prompts = json.loads(args.prompts_json.read_text())["prompts"]
        if args.prompt not in prompts:
            ap.error(f"--prompt {args.prompt!r} not in {args.prompts_json} (has {sorted(prompts)})")
        tokens = prompts[args.prompt]
    try:
        checks = dump(args.model, tokens, args.out, args.dtype, args.threads)
    except (ValueError, RuntimeError, OSError) as e:
        sys.exit(f"hf_dump: {e}")
    print(f"wrote {args.out} ({len(tokens)} tokens); self-checks {checks}")


if __name__ == "__main__":
    main()
