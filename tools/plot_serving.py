#!/usr/bin/env python3
"""Plot bench_serving.py reports: output tokens/s and TPOT p50 against concurrency, as SVG.

No dependencies (writes the SVG by hand), so it runs anywhere the reports are:

    python3 tools/plot_serving.py OUT.svg LABEL=report.json [LABEL=report.json ...]

x: concurrency on a log2 axis; left panel output tok/s, right panel TPOT p50 (ms).
"""

import json
import math
import sys

W, H, PAD = 420, 300, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def panel(x0, series, key, title):
    xs = sorted({c for _, pts in series for c, _ in pts})
    ymax = max(v for _, pts in series for _, v in pts) * 1.1 or 1.0
    lx = lambda c: x0 + PAD + (math.log2(c) - math.log2(xs[0])) / max(math.log2(xs[-1]) - math.log2(xs[0]), 1) * (W - 2 * PAD)
    ly = lambda v: H - PAD - v / ymax * (H - 2 * PAD)
    out = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{x0 + PAD}" y1="{H - PAD}" x2="{x0 + W - PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<line x1="{x0 + PAD}" y1="{PAD}" x2="{x0 + PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<text x="{x0 + W / 2}" y="{H - 12}" text-anchor="middle" font-size="12">concurrency</text>']
    for c in xs:
        out.append(f'<text x="{lx(c):.1f}" y="{H - PAD + 15}" text-anchor="middle" font-size="11">{c}</text>')
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<text x="{x0 + PAD - 5}" y="{ly(v) + 4:.1f}" text-anchor="end" font-size="11">{v:.0f}</text>')
        out.append(f'<line x1="{x0 + PAD}" y1="{ly(v):.1f}" x2="{x0 + W - PAD}" y2="{ly(v):.1f}" stroke="#ddd"/>')
    for i, (label, pts) in enumerate(series):
        col = COLORS[i % len(COLORS)]
        path = " ".join(f"{'M' if j == 0 else 'L'}{lx(c):.1f},{ly(v):.1f}" for j, (c, v) in enumerate(pts))
        out.append(f'<path d="{path}" fill="none" stroke="{col}" stroke-width="2"/>')
        for c, v in pts:
            out.append(f'<circle cx="{lx(c):.1f}" cy="{ly(v):.1f}" r="3" fill="{col}"/>')
        out.append(f'<text x="{x0 + PAD + 8}" y="{PAD + 14 * (i + 1)}" font-size="11" fill="{col}">{label}</text>')
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_path, reports = sys.argv[1], sys.argv[2:]
    tput, tpot = [], []
    for r in reports:
        label, path = r.rsplit("=", 1)
        levels = json.load(open(path))["levels"]
        tput.append((label, [(l["concurrency"], l["output_throughput_tok_s"]) for l in levels]))
        tpot.append((label, [(l["concurrency"], l["tpot_ms"]["p50"]) for l in levels]))
    body = panel(0, tput, "output", "output tokens/s") + panel(W, tpot, "tpot", "TPOT p50 (ms)")
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H}" font-family="sans-serif">' \
          f'<rect width="100%" height="100%" fill="white"/>{"".join(body)}</svg>\n'
    open(out_path, "w").write(svg)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
