#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (mlaserve, vLLM, llama.cpp's server).

Fixed input and output lengths, `ignore_eos`, streaming `/v1/completions`, a sweep over
concurrency levels. Per level it reports TTFT, TPOT, ITL and end-to-end latency (mean, p50, p99,
in ms), output tokens/s and requests/s, as JSON on stdout (and in --out).

Definitions (as vLLM's benchmark_serving):
  TTFT  time from sending the request to the first streamed token chunk;
  TPOT  (latency - TTFT) / (output_tokens - 1), per request;
  ITL   the gaps between consecutive token chunks, pooled over all requests (a chunk that carries
        several tokens counts as one gap);
  output throughput = all output tokens / wall time of the level.

Prompts are token-id arrays (the completions API accepts them), so the input length is exact:
ids drawn uniformly from [--min-token-id, --vocab-size) with a fixed seed.

Install: python3 -m venv .venv && .venv/bin/pip install -r bench/serving/requirements.txt
Run:     .venv/bin/python bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
             --input-len 128 --output-len 128 --concurrency 1,4,16,64 --out result.json
"""

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import httpx


@dataclass
class RequestResult:
    ok: bool
    latency: float = 0.0
    ttft: float = 0.0
    output_tokens: int = 0
    itls: list = field(default_factory=list)
    error: str = ""


async def one_request(client: httpx.AsyncClient, model: str, prompt: list, output_len: int,
                      sampling: dict) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        **sampling,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "stream error")
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices", [])):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = time.perf_counter() - start
    result.ok = last is not None
    if not result.ok:
        result.error = "no token received"
    return result


def summarize(values_s: list) -> dict:
    if not values_s:
        return {"mean": None, "p50": None, "p99": None}
    ms = sorted(v * 1000 for v in values_s)

    def pct(p):
        k = (len(ms) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(ms) - 1)
        return ms[lo] + (ms[hi] - ms[lo]) * (k - lo)

    return {"mean": round(statistics.fmean(ms), 3), "p50": round(pct(50), 3), "p99": round(pct(99), 3)}


async def run_level(base_url: str, model: str, prompts: list, output_len: int, concurrency: int,
                    sampling: dict, timeout: float) -> dict:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:
        semaphore = asyncio.Semaphore(concurrency)

        async def guarded(prompt):
            async with semaphore:
                return await one_request(client, model, prompt, output_len, sampling)

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(p) for p in prompts))
        duration = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "concurrency": concurrency,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": round(duration, 3),
        "output_tokens": output_tokens,
        "output_throughput_tok_s": round(output_tokens / duration, 2) if duration > 0 else None,
        "request_throughput_req_s": round(len(ok) / duration, 3) if duration > 0 else None,
        "ttft_ms": summarize([r.ttft for r in ok]),
        "tpot_ms": summarize(tpots),
        "itl_ms": summarize([x for r in ok for x in r.itls]),
        "e2e_latency_ms": summarize([r.latency for r in ok]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="model name (default: the first of /v1/models)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", default="1,4,16,64", help="comma-separated levels")
    ap.add_argument("--num-prompts", type=int, default=0,
                    help="requests per level (default: max(4 * concurrency, 8))")
    ap.add_argument("--vocab-size", type=int, default=500, help="prompt ids are drawn below this")
    ap.add_argument("--min-token-id", type=int, default=10, help="prompt ids are drawn from here up")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, help="top_p of every request (default: not sent)")
    ap.add_argument("--top-k", type=int, help="top_k of every request (default: not sent)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    ap.add_argument("--warmup", type=int, default=2, help="requests sent before measuring")
    ap.add_argument("--out", help="also write the JSON report here")
    args = ap.parse_args()

    base_url = args.base_url.rstrip("/")
    model = args.model or httpx.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    rng = random.Random(args.seed)

    def prompts(count):
        return [[rng.randrange(args.min_token_id, args.vocab_size) for _ in range(args.input_len)]
                for _ in range(count)]

    sampling = {"temperature": args.temperature}
    if args.top_p is not None:
        sampling["top_p"] = args.top_p
    if args.top_k is not None:
        sampling["top_k"] = args.top_k
    if args.warmup:
        asyncio.run(run_level(base_url, model, prompts(args.warmup), min(args.output_len, 8), 1,
                              sampling, args.timeout))
    report = {
        "tool": "bench/serving/bench_serving.py",
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "client_host": {"machine": platform.machine(), "system": platform.system(), "python": platform.python_version()},
        "base_url": base_url,
        "model": model,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "temperature": args.temperature,
        "sampling": sampling,
        "levels": [],
    }
    for c in levels:
        n = args.num_prompts or max(4 * c, 8)
        level = asyncio.run(run_level(base_url, model, prompts(n), args.output_len, c, sampling,
                                      args.timeout))
        print(f"concurrency {c}: {level['completed']}/{n} ok, {level['output_throughput_tok_s']} tok/s, "
              f"TTFT p50 {level['ttft_ms']['p50']} ms, TPOT p50 {level['tpot_ms']['p50']} ms", file=sys.stderr)
        report["levels"].append(level)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if all(level["failed"] == 0 for level in report["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
