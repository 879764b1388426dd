"""Builds a tiny random HF model from a ModelSpec and writes the `hf/` checkpoint.

Initialisation (all from one torch.Generator seeded with the model seed, parameters visited in
`named_parameters()` order, then buffers):
- embeddings: N(0, 1); every other matrix `[out, in]`: N(0, 1/in); experts' 3-D
  `gate_up_proj [E, 2F, H]`: N(0, 1/H), `down_proj [E, H, F]`: N(0, 1/F) — so activations stay
  O(1) and attention / routing patterns are far from uniform;
- RMSNorm / LayerNorm weights: 1 + N(0, 0.1^2); LayerNorm bias: N(0, 0.1^2);
- `e_score_correction_bias` (a buffer, left at zero by HF init): N(0, 0.1^2), explicitly.
Weights are float32 and saved as float32 safetensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .specs import ModelSpec


def make_config(spec: ModelSpec, tok_ids: dict):
    import transformers

    cls = getattr(transformers, spec.arch.replace("ForCausalLM", "Config"))
    kwargs = dict(spec.hf_config)
    kwargs.update({k: v for k, v in tok_ids.items() if k != "pad_token_id"})
    kwargs["pad_token_id"] = tok_ids.get("pad_token_id")
    return cls(**kwargs)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    for name, p in model.named_parameters():
        if name.endswith("embed_tokens.weight"):
            v = normal(p.shape, 1.0)
        elif p.dim() == 1:
            is_bias = name.endswith(".bias")
            v = normal(p.shape, 0.1) + (0.0 if is_bias else 1.0)
        elif name.endswith("experts.gate_up_proj"):
            v = normal(p.shape, 1.0 / math.sqrt(p.shape[2]))
        elif name.endswith("experts.down_proj"):
            v = normal(p.shape, 1.0 / math.sqrt(p.shape[2]))
        elif p.dim() == 2:
            v = normal(p.shape, 1.0 / math.sqrt(p.shape[1]))
        else:
            raise ValueError(f"no init rule for parameter {name} with shape {tuple(p.shape)}")
        p.copy_(v.to(p.dtype))
    n_bias = 0
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(normal(b.shape, 0.1).to(b.dtype))
            n_bias += 1
    want = sum(1 for m in model.modules() if hasattr(m, "e_score_correction_bias"))
    if n_bias != want:
        raise RuntimeError(f"randomized {n_bias} e_score_correction_bias buffers, expected {want}")


def build_model(spec: ModelSpec, tok_ids: dict, seed: int):
    import transformers

    cfg = make_config(spec, tok_ids)
    model_cls = getattr(transformers, spec.arch)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    # Plain PyTorch paths (they also run in float64): eager attention, per-expert loop.
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    randomize(model, seed)
    return model


def save_hf(model, spec: ModelSpec, tokenizer, tok_flavour: str, out_dir: Path, tok_ids: dict) -> None:
    from transformers import GenerationConfig

    from .tok import save_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(spec.extra_config_json)
    cfg.pop("_attn_implementation", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = GenerationConfig(
        do_sample=False,
        bos_token_id=tok_ids.get("bos_token_id"),
        eos_token_id=tok_ids.get("eos_token_id"),
        pad_token_id=tok_ids.get("pad_token_id"),
    )
    gen.save_pretrained(out_dir)
    save_tokenizer(tokenizer, tok_flavour, out_dir)


def check_saved_weights(model, out_dir: Path) -> None:
    """The saved checkpoint must reload to bit-identical tensors (incl. the randomized buffer)."""
    import transformers

    reloaded = getattr(transformers, type(model).__name__).from_pretrained(out_dir, dtype=torch.float32)
    a = model.state_dict()
    b = reloaded.state_dict()
    if a.keys() != b.keys():
        raise RuntimeError(f"reloaded keys differ: {sorted(set(a) ^ set(b))}")
    for k in a:
        if not torch.equal(a[k], b[k]):
            raise RuntimeError(f"reloaded tensor {k} differs from the saved model")
