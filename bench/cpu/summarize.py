#!/usr/bin/env python3
"""Prints the markdown table of bench/cpu/raw/*.json: pp/tg t/s of llama.cpp and mlaserve, and the ratio.

llama-bench JSON: a list of tests with n_prompt/n_gen, avg_ts, stddev_ts (mean ± sd over reps).
mlaserve bench JSON: {"results": [{"test": "pp512", "tokens_per_s_median", "spread", "reps"}]}
(median ± half-range). The ratio is mlaserve median / llama.cpp mean.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RAW = Path(__file__).resolve().parent / "raw"


def llama(path: Path) -> dict[str, tuple[float, float, int]]:
    rows = {}
    for t in json.loads(path.read_text()):
        name = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
        rows[name] = (t["avg_ts"], t["stddev_ts"], len(t.get("samples_ts", [])))
    return rows


def ours(path: Path) -> dict[str, tuple[float, float, int]]:
    d = json.loads(path.read_text())
    return {r["test"]: (r["tokens_per_s_median"], r["spread"], r["reps"]) for r in d["results"]}


def main() -> None:
    print("| quant | test | llama.cpp t/s (mean ± sd) | mlaserve t/s (median ± half-range) | ours / llama.cpp |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for q in sys.argv[1:] or ["Q8_0", "Q4_K_M", "BF16"]:
        lp, op = RAW / f"llamacpp-{q}.json", RAW / f"mlaserve-{q}.json"
        lr = llama(lp) if lp.exists() and lp.stat().st_size else {}
        orr = ours(op) if op.exists() and op.stat().st_size else {}
        for test in sorted(set(lr) | set(orr)):
            a = lr.get(test)
            b = orr.get(test)
            fa = f"{a[0]:.2f} ± {a[1]:.2f} (r={a[2]})" if a else "—"
            fb = f"{b[0]:.2f} ± {b[1]:.2f} (r={b[2]})" if b else "—"
            ratio = f"{b[0] / a[0]:.2f}×" if a and b else "—"
            print(f"| {q} | {test} | {fa} | {fb} | {ratio} |")


if __name__ == "__main__":
    main()
