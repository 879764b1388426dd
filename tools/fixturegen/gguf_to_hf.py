"""Maps the tensors of a deepseek2 / glm-dsa GGUF file back to an HF state dict.

Used to (a) prove the F32 file holds exactly the HF weights, and (b) build the BF16 / Q8_0 /
Q4_K_M references from the weights as the files hold them (dequantized with gguf-py's
`gguf.quants`, which is bit-exact with ggml).

Name map (GGUF torch-order shapes; HF 5.x keeps experts fused as 3-D tensors):
  token_embd -> model.embed_tokens, output -> lm_head, output_norm -> model.norm
  blk.N.attn_k_b [N,Lkv,P] + attn_v_b [N,V,Lkv] -> kv_b_proj [N*(P+V), Lkv] (per head [K_nope | V])
  blk.N.ffn_gate_exps [E,F,H] + ffn_up_exps [E,F,H] -> mlp.experts.gate_up_proj [E, 2F, H]
  blk.N.ffn_down_exps [E,H,F] -> mlp.experts.down_proj
Every GGUF tensor must be consumed and every HF state-dict key produced exactly once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
BLK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "indexer.attn_q_b.weight": "self_attn.indexer.wq_b.weight",
    "indexer.attn_k.weight": "self_attn.indexer.wk.weight",
    "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",
    "indexer.k_norm.bias": "self_attn.indexer.k_norm.bias",
    "indexer.proj.weight": "self_attn.indexer.weights_proj.weight",
}


def read_dequantized(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors of a GGUF file as float32 numpy arrays in torch order, plus their ggml types."""
    import gguf

    reader = gguf.GGUFReader(path)
    arrays: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # ne is innermost-first
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            a = np.asarray(t.data, dtype=np.float32)
        else:
            a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        arrays[t.name] = a.reshape(shape)
        types[t.name] = t.tensor_type.name
    return arrays, types


def to_hf_state_dict(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()

    def put(key: str, value: np.ndarray, *sources: str) -> None:
        if key in out:
            raise ValueError(f"HF key {key} produced twice (from {sources})")
        out[key] = value
        used.update(sources)

    for name, a in arrays.items():
        if name in TOP:
            put(TOP[name], a, name)
            continue
        if not name.startswith("blk."):
            raise ValueError(f"unmapped GGUF tensor {name}")
        _, bid, rest = name.split(".", 2)
        pre = f"model.layers.{int(bid)}."
        if rest in BLK:
            put(pre + BLK[rest], a, name)
        elif rest == "attn_k_b.weight":
            v_name = f"blk.{bid}.attn_v_b.weight"
            k_b, v_b = a, arrays[v_name]  # [N, Lkv, P], [N, V, Lkv]
            n, lkv, p = k_b.shape
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(n * (p + v_b.shape[1]), lkv)
            put(pre + "self_attn.kv_b_proj.weight", kv_b, name, v_name)
        elif rest == "ffn_gate_exps.weight":
            up_name = f"blk.{bid}.ffn_up_exps.weight"
            put(pre + "mlp.experts.gate_up_proj", np.concatenate([a, arrays[up_name]], axis=1), name, up_name)
        elif rest in ("attn_v_b.weight", "ffn_up_exps.weight"):
            continue  # consumed with its partner
        else:
            raise ValueError(f"unmapped GGUF tensor {name}")
    missing = set(arrays) - used
    if missing:
        raise ValueError(f"GGUF tensors not consumed: {sorted(missing)}")
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Strict load (shapes and key sets must match the HF model exactly)."""
    own = model.state_dict()
    if set(own) != set(state):
        raise ValueError(f"GGUF->HF key mismatch: missing {sorted(set(own) - set(state))}, extra {sorted(set(state) - set(own))}")
    for k, v in state.items():
        if tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(f"{k}: GGUF gives shape {tuple(v.shape)}, HF wants {tuple(own[k].shape)}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


def assert_equal_to(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    for k, v in state.items():
        if not torch.equal(own[k].to(torch.float32), v):
            diff = (own[k].to(torch.float32) - v).abs().max().item()
            raise AssertionError(f"{k}: GGUF tensor differs from HF weight (max abs diff {diff})")
