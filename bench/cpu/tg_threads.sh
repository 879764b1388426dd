#!/usr/bin/env bash
# tg128 re-run at 2 and 1 threads (Q8_0, r=3) for both engines, alternating; writes raw/round2/.
# Shows how each engine's decode speed reacts to an oversubscribed machine (see README).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
R="$HERE/raw/round2"; mkdir -p "$R"
B="${LLAMA_BENCH:-/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}"
S="${MLASERVE:-$HERE/../../target/release/mlaserve}"
M="${MODELS:-/work/bench-models/dsv2-1b}/bench-Q8_0.gguf"
l() { echo "$(date -u +%FT%TZ) $1 $(uptime | sed 's/.*load average/load average/')" >> "$R/load.log"; }
l "before llama.cpp Q8_0 tg -t2"
"$B" -m "$M" -t 2 -p 0 -n 128 -r 3 --repack 0 -o json > "$R/llamacpp-Q8_0-tg128.json" 2>/dev/null
l "before mlaserve Q8_0 tg"
"$S" bench --model "$M" -p 0 -n 128 -r 3 --json > "$R/mlaserve-Q8_0-tg128.json" 2>/dev/null
l "before llama.cpp Q8_0 tg -t1"
"$B" -m "$M" -t 1 -p 0 -n 128 -r 3 --repack 0 -o json > "$R/llamacpp-Q8_0-tg128-t1.json" 2>/dev/null
l "before mlaserve Q8_0 tg RAYON_NUM_THREADS=1"
RAYON_NUM_THREADS=1 "$S" bench --model "$M" -p 0 -n 128 -r 3 --json > "$R/mlaserve-Q8_0-tg128-t1.json" 2>/dev/null
l "done"
