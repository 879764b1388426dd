#!/usr/bin/env python3
"""Prints the markdown table of a bench/cpu/run.sh result: pp/tg tokens/s per engine, the
median over rounds of each round's figure, and ratios to llama.cpp (default build: repacked
weights).

    python3 bench/cpu/summarize.py [RAW_DIR] [QUANTS...]

llama-bench JSON: a list of tests with n_prompt/n_gen and avg_ts (mean over its reps).
mlaserve bench JSON: {"results": [{"test": "pp512", "tokens_per_s_median", ...}]}.
Engines: llamacpp, llamacpp_norepack (--repack 0), mlaserve, baseline (an older build).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ENGINES = ["llamacpp", "llamacpp_norepack", "mlaserve", "baseline"]
LABELS = {
    "llamacpp": "llama.cpp",
    "llamacpp_norepack": "llama.cpp --repack 0",
    "mlaserve": "mlaserve",
    "baseline": "mlaserve before",
}


def figures(path: Path) -> dict[str, float]:
    d = json.loads(path.read_text())
    if isinstance(d, list):
        return {
            (f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"): t["avg_ts"] for t in d
        }
    return {r["test"]: r["tokens_per_s_median"] for r in d["results"]}


def main() -> None:
    args = sys.argv[1:]
    raw = Path(args.pop(0)) if args and Path(args[0]).is_dir() else Path(__file__).parent / "raw"
    quants = args or ["Q8_0", "Q4_K_M", "BF16"]
    rounds = sorted(p for p in raw.glob("r*") if p.is_dir())
    present = [e for e in ENGINES if any((r / f"{e}-{q}.json").exists() for r in rounds for q in quants)]
    head = " | ".join(f"{LABELS[e]}" for e in present)
    print(f"| quant | test | {head} | mlaserve / llama.cpp |")
    print("| --- | --- | " + " | ".join("---:" for _ in present) + " | ---: |")
    for q in quants:
        per: dict[str, dict[str, list[float]]] = {}
        for e in present:
            for r in rounds:
                p = r / f"{e}-{q}.json"
                if p.exists() and p.stat().st_size:
                    for test, v in figures(p).items():
                        per.setdefault(test, {}).setdefault(e, []).append(v)
        for test in sorted(per):
            med = {e: statistics.median(v) for e, v in per[test].items()}
            cells = []
            for e in present:
                v = per[test].get(e)
                cells.append(f"{med[e]:.1f} ({min(v):.1f}-{max(v):.1f})" if v else "—")
            ratio = (
                f"{med['mlaserve'] / med['llamacpp']:.2f}x"
                if "mlaserve" in med and "llamacpp" in med
                else "—"
            )
            print(f"| {q} | {test} | " + " | ".join(cells) + f" | {ratio} |")
    print(f"\n{len(rounds)} rounds; each cell: median over rounds (min-max).")


if __name__ == "__main__":
    main()
