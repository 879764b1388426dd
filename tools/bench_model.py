#!/usr/bin/env python3
"""Makes the CPU benchmark model: a DeepSeek-V2-shaped checkpoint with random weights (~1.13B params).

    /work/pyenv/venv/bin/python tools/bench_model.py --out /work/bench-models/dsv2-1b \
        --llama-cpp /path/to/llama.cpp --quantize /path/to/llama-quantize

Shape (fixed, see BENCH_CONFIG): hidden 1024, 8 layers (layer 0 dense with intermediate 4096),
16 heads, q_lora_rank 512, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, 64 routed experts
top-6 + 2 shared (moe_intermediate 704), vocab 32000, softmax greedy routing (n_group 1), plain RoPE.

Invariants:
- weights are created in bfloat16 directly (except the small float32 MoE router HF insists on) (no float32 copy of the model is ever held); every matrix
  is N(0, 0.02^2), norm weights are 1 — the numbers are meaningless, only the shapes and the compute
  matter (this is a speed benchmark, not a correctness fixture);
- the tokenizer is the 512-token fixture BPE (tools/fixturegen/tok.py); config.vocab_size is 32000
  and llama.cpp's converter pads the GGUF vocab with [PADn] tokens up to 32000, so embedding and
  output matrices have the full 32000 rows;
- outputs live outside the repo: <out>/hf (safetensors), <out>/bench-BF16.gguf, -Q8_0, -Q4_K_M.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixturegen import convert, tok  # noqa: E402

BENCH_CONFIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=4096,
    moe_intermediate_size=704,
    num_hidden_layers=8,
    first_k_dense_replace=1,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=512,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=64,
    num_experts_per_tok=6,
    n_shared_experts=2,
    routed_scaling_factor=1.0,
    topk_method="greedy",
    n_group=1,
    topk_group=1,
    norm_topk_prob=False,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_bias=False,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
)
INIT_STD = 0.02
SEED = 20261129


def build(out_hf: Path) -> int:
    import transformers

    hf_tok = tok.build_tokenizer("deepseek")
    ids = tok.special_ids(hf_tok, "deepseek")
    cfg = transformers.DeepseekV2Config(**BENCH_CONFIG, **ids)
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.DeepseekV2ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    g = torch.Generator().manual_seed(SEED)
    n_params = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            # HF keeps the MoE router (`mlp.gate.weight`, [64, 1024]) in float32 on purpose.
            if p.dtype != torch.bfloat16 and not name.endswith("mlp.gate.weight"):
                raise RuntimeError(f"{name} is {p.dtype}, expected bfloat16")
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=g)
            n_params += p.numel()
    out_hf.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_hf, safe_serialization=True)
    cfg_path = out_hf / "config.json"
    cfg_json = json.loads(cfg_path.read_text())
    cfg_json["scoring_func"] = "softmax"
    cfg_json["topk_method"] = "greedy"
    cfg_json.pop("_attn_implementation", None)
    cfg_path.write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
    tok.save_tokenizer(hf_tok, "deepseek", out_hf)
    return n_params


def quantize(quantize_bin: Path, src: Path, dst: Path, qtype: str) -> None:
    """llama-quantize with bytes output (it prints token text that need not be valid UTF-8)."""
    tmp = dst.with_suffix(".gguf.part")
    res = subprocess.run([str(quantize_bin), str(src), str(tmp), qtype, "2"], capture_output=True)
    if res.returncode != 0 or not tmp.exists():
        tail = (res.stdout[-3000:] + res.stderr[-3000:]).decode("utf-8", errors="replace")
        raise RuntimeError(f"llama-quantize {qtype} failed ({res.returncode}):\n{tail}")
    tmp.rename(dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/work/bench-models/dsv2-1b"))
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source dir (convert_hf_to_gguf.py)")
    ap.add_argument("--quantize", type=Path, required=True, help="llama-quantize binary")
    ap.add_argument("--quants", default="Q8_0,Q4_K_M", help="comma-separated llama-quantize types")
    args = ap.parse_args()

    out: Path = args.out.resolve()
    repo = Path(__file__).resolve().parent.parent
    if out.is_relative_to(repo):
        raise SystemExit(f"--out {out} is inside the repo; bench models are GiB-sized, put them elsewhere")
    hf_dir = out / "hf"
    t0 = time.time()
    if not (hf_dir / "config.json").exists():
        n = build(hf_dir)
        print(f"built HF checkpoint: {n / 1e9:.3f}B params in {time.time() - t0:.0f}s", flush=True)
    bf16 = out / "bench-BF16.gguf"
    if not bf16.exists():
        t1 = time.time()
        convert.run_converter(args.llama_cpp, hf_dir, bf16, "bf16", "mlaserve-bench-dsv2-1b")
        print(f"converted {bf16.name} in {time.time() - t1:.0f}s", flush=True)
    for q in [s.strip() for s in args.quants.split(",") if s.strip()]:
        dst = out / f"bench-{q}.gguf"
        if dst.exists():
            continue
        t1 = time.time()
        quantize(args.quantize, bf16, dst, q)
        print(f"quantized {dst.name} in {time.time() - t1:.0f}s", flush=True)
    for f in sorted(out.glob("*.gguf")):
        print(f"{f}  {f.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
