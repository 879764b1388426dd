"""The peer for the MLA decode kernel lab (crates/cuda/examples/mla_decode.rs): vLLM's public
Triton MLA decode kernel (`vllm/attention/ops/triton_decode_attention.py`, grouped path: 16 heads
a program, tl.dot on tensor cores, split-KV + a reduce kernel) on the same shapes — bf16 latent
cache [pages, 64, 1, 576] in shuffled pages, V = its first 512 columns, q [B, H, 576] bf16.

The vLLM file is not part of this repository: put it in .device/peer/ (ignored by git) with a
stub `vllm/platforms` package that answers `current_platform.is_rocm()` with False. This driver
imports it from there, checks it against a float32 torch reference (ctx not a multiple of the
page, 16 and 128 heads), then times it two ways: CUDA events around batches of 10
back-to-back launches, median of 7 after 3 warm-ups (the lab's method), and
triton.testing.do_bench (median, L2 flushed before each launch).
Bytes and FLOPs as in the lab: cache rows + q (576 f32 per head) + out (512 bf16 per head);
2*B*H*ctx*(576+512).

    python3 bench/cuda/mla_decode_triton.py [--json out.json] [--splits 4 8 16]
"""

import argparse
import json
import os
import sys

import torch
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".device", "peer"))
from triton_decode_attention import decode_attention_fwd  # noqa: E402

L, R, PAGE = 512, 64, 64
W = L + R
COPY_GBS, GEMM_TFS = 3970.0, 804.0


def make(b, h, ctx, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = -(-ctx // PAGE)
    npages = b * pages_per
    kv = (torch.rand(npages, PAGE, 1, W, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    perm = torch.randperm(npages, device="cuda", generator=g).to(torch.int32)
    req_to_token = perm.view(b, pages_per).contiguous()
    q = (torch.rand(b, h, W, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    seq = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    return kv, req_to_token, q, seq


def run(kv, req_to_token, q, seq, splits, scale):
    b, h = q.shape[0], q.shape[1]
    o = torch.empty(b, h, L, dtype=torch.bfloat16, device="cuda")
    logits = torch.empty(b, h, splits, L + 1, dtype=torch.float32, device="cuda")
    v = kv[..., :L]

    def fn():
        decode_attention_fwd(q, kv, v, o, req_to_token, seq, logits, splits, scale, PAGE)

    return fn, o


def reference(kv, req_to_token, q, seq, scale):
    rows = kv.view(-1, W).float()
    out = []
    for i in range(q.shape[0]):
        n = int(seq[i])
        pos = torch.arange(n, device="cuda")
        slots = req_to_token[i].long()[pos // PAGE] * PAGE + pos % PAGE
        k = rows[slots]
        p = torch.softmax(q[i].float() @ k.T * scale, dim=-1)
        out.append(p @ k[:, :L])
    return torch.stack(out)


def time_events(fn, batches=7, per=10):
    """µs per launch: batches of back-to-back launches between two CUDA events (the host
    enqueues ahead, so Python's launch latency stays out), after 3 warm-ups; median."""
    for _ in range(3):
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
        times.append(e0.elapsed_time(e1) * 1e3 / per)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--splits", type=int, nargs="+", default=[4, 8, 16])
    args = ap.parse_args()
    scale = (128 + 64) ** -0.5
    checks = []
    for b, h, ctx in [(3, 16, 300), (2, 128, 1000)]:
        kv, rt, q, seq = make(b, h, ctx, 7 + ctx)
        fn, o = run(kv, rt, q, seq, 4, scale)
        fn()
        want = reference(kv, rt, q, seq, scale)
        err = ((o.float() - want).abs().max() / want.abs().max()).item()
        print(f"check B{b} H{h} ctx{ctx}: rel err {err:.3e}")
        checks.append({"batch": b, "heads": h, "ctx": ctx, "rel_err": err})
    rows, table = [], []
    for b, h, ctx in [(64, 16, 4096), (128, 16, 8192), (64, 32, 4096), (64, 64, 4096), (64, 128, 4096), (128, 128, 4096)]:
        kv, rt, q, seq = make(b, h, ctx, b * 1000 + h + ctx)
        nbytes = b * ctx * W * 2 + b * h * W * 4 + b * h * L * 2
        flops = 2 * b * h * ctx * (W + L)
        best = None
        for splits in args.splits:
            fn, _ = run(kv, rt, q, seq, splits, scale)
            us = time_events(fn)
            us_bench = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            gbs, tfs = nbytes / us / 1e3, flops / us / 1e6
            print(f"B{b} H{h} ctx{ctx} triton splits {splits:>2}: {us:8.1f} µs (do_bench {us_bench:.1f}) {gbs:6.0f} GB/s {tfs:6.1f} TFLOP/s")
            rows.append({"batch": b, "heads": h, "ctx": ctx, "kernel": "vllm_triton", "splits": splits,
                         "us_median": us, "us_do_bench": us_bench, "gb_s": gbs, "tflop_s": tfs})
            if best is None or us < best[0]:
                best = (us, splits)
        us, splits = best
        table.append(f"| {b} | {h} | {ctx} | vLLM Triton | {splits} | {us:.1f} | {nbytes / us / 1e3:.0f} | "
                     f"{100 * nbytes / us / 1e3 / COPY_GBS:.0f}% | {flops / us / 1e6:.1f} | {100 * flops / us / 1e6 / GEMM_TFS:.1f}% |")
        del kv
        torch.cuda.empty_cache()
    print()
    print("| B | heads | ctx | kernel | splits | µs (median) | GB/s | % copy | TFLOP/s | % GEMM |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for line in table:
        print(line)
    if args.json:
        doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "checks": checks, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
