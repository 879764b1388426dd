#!/usr/bin/env python3
"""Read `s37-run1.sh`'s timeline dumps (`timeline-s37.patch`'s MLA_LAB_TL): the last layer's
q|kv_a GEMV, attention, o_proj GEMV and routing, each block's %globaltimer at its start, after
its PDL wait and at its end, in ns after the GEMV's first block started.

    python3 bench/cuda/timeline_s37.py bench/cuda/s37/run1-tl-0-1.bin.gz [...]

(the run's files are kept gzipped in bench/cuda/s37/: run1-* from `s37-run1.sh`, run2-* from
`s37-run2.sh`; tl-0 the default build, the others as the run script names them).
"""
import gzip
import struct
import sys

NAMES = ["q|kv_a GEMV", "mla_attn_cl", "o_proj GEMV", "routing (t 0)"]


def pct(v, f):
    v = sorted(v)
    return v[min(len(v) - 1, int(round((len(v) - 1) * f)))]


def show(path):
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    w = struct.unpack("<%dq" % (len(raw) // 8), raw)
    regions = []
    for r in range(4):
        blocks = [w[1024 * r + 4 * b: 1024 * r + 4 * b + 4] for b in range(256)]
        regions.append([b for b in blocks if b[0] != 0])
    if not regions[0]:
        print(path, ": no GEMV stamps")
        return
    t0 = min(b[0] for b in regions[0])
    print(f"{path}: ns after the q|kv_a GEMV's first block started (first / median / last)")
    for name, bl in zip(NAMES, regions):
        if not bl:
            print(f"  {name}: none")
            continue
        cols = []
        for i, what in enumerate(["start", "wait returned", "end"]):
            v = [b[i] - t0 for b in bl if b[i] != 0]
            if v:
                cols.append(f"{what} {min(v)} / {pct(v, .5)} / {max(v)}")
        sms = len({b[3] for b in bl})
        print(f"  {name} ({len(bl)} blocks on {sms} SMs): " + "; ".join(cols))
    g, a = regions[0], regions[1]
    if g and a:
        g_end = max(b[2] for b in g if b[2])
        early = sum(1 for b in a if b[0] < g_end)
        print(f"  attention blocks started before the GEMV's last block ended: {early} of {len(a)}")
        gsm = {b[3] for b in g}
        print(f"  attention blocks on SMs the GEMV also ran on: "
              f"{sum(1 for b in a if b[3] in gsm)} of {len(a)}")


for p in sys.argv[1:]:
    show(p)
