"""The peer for the prefill attention kernel lab (crates/cuda/examples/flash_attn.rs): torch's
scaled_dot_product_attention, causal, bf16, on the lab's shapes, once per backend (cuDNN,
FlashAttention-2, memory-efficient; a backend that refuses a shape, e.g. FlashAttention-2 with
qk != v, is reported as such). Timed like the lab: CUDA events around 3 back-to-back calls,
median of 5 batches after 2 warm-ups. FLOPs as in the lab: 2*(qk+v) per attended
(query, key, head), B*N*L*(L+1)/2 pairs.

    python3 bench/cuda/flash_attn_sdpa.py [--json out.json]
"""

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # (batch, len, heads, qk, v), as in the lab
    (1, 4096, 16, 192, 128),
    (1, 8192, 16, 192, 128),
    (4, 2048, 128, 192, 128),
    (1, 8192, 16, 256, 256),
    (1, 4096, 64, 256, 256),
    (8, 512, 16, 192, 128),
]
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash2": SDPBackend.FLASH_ATTENTION,
    "mem_efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_ms(fn, batches=5, per=3):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(per):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / per)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for b, length, n, qk, v in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = (torch.rand(b, n, length, qk, device="cuda", generator=g) * 2 - 1).bfloat16()
        k = (torch.rand(b, n, length, qk, device="cuda", generator=g) * 2 - 1).bfloat16()
        vv = (torch.rand(b, n, length, v, device="cuda", generator=g) * 2 - 1).bfloat16()
        flops = b * n * length * (length + 1) / 2 * 2 * (qk + v)
        ref = None
        shape = f"B{b} len{length} N{n} qk{qk} v{v}"
        for name, be in BACKENDS.items():
            try:
                with sdpa_kernel([be]):
                    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, vv, is_causal=True)
                    out = fn()
                    if ref is None:
                        ref = out.float()
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    ms = time_ms(fn)
                tfs = flops / ms / 1e9
                print(f"{shape}: {name} {ms:.3f} ms {tfs:.0f} TFLOP/s (max diff vs first backend {err:.1e})")
                rows.append({"shape": shape, "backend": name, "ms": ms, "tflop_s": tfs})
            except RuntimeError as e:
                msg = str(e).splitlines()[0][:120]
                print(f"{shape}: {name} refused: {msg}")
                rows.append({"shape": shape, "backend": name, "refused": msg})
        del q, k, vv, ref
        torch.cuda.empty_cache()
    if args.json:
        doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version(), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
