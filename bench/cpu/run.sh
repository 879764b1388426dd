#!/usr/bin/env bash
# CPU benchmark: mlaserve bench against llama.cpp's llama-bench on the same GGUF files, in
# interleaved rounds (every engine once per quant type per round) so all see the same machine
# load. Raw JSON and load averages go to $OUT/r<round>/; summarize.py takes medians over rounds.
#
#   bench/cpu/run.sh [ROUNDS] [QUANTS...]      e.g. bench/cpu/run.sh 3 Q8_0 Q4_K_M BF16
#
# Env: MODELS (default /work/bench-models/dsv2-1b), LLAMA_BENCH, MLASERVE, THREADS (default 2),
#      REPS (reps per call, default 3), OUT (default bench/cpu/raw),
#      BASELINE (optional: a second mlaserve binary, e.g. an older commit's build, run as
#      "baseline"), LLAMA_REPACK0=1 (also run llama.cpp with --repack 0: its non-interleaved
#      kernels).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
MODELS="${MODELS:-/work/bench-models/dsv2-1b}"
LLAMA_BENCH="${LLAMA_BENCH:-/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}"
MLASERVE="${MLASERVE:-$REPO/target/release/mlaserve}"
THREADS="${THREADS:-2}"
REPS="${REPS:-3}"
ROUNDS="${1:-3}"
shift || true
QUANTS=("${@:-Q8_0 Q4_K_M}")
# shellcheck disable=SC2206
QUANTS=(${QUANTS[*]})
OUT="${OUT:-$HERE/raw}"
mkdir -p "$OUT"

log_load() { echo "$(date -u +%FT%TZ) $1 $(uptime | sed 's/.*load average/load average/')" | tee -a "$OUT/load.log"; }

for ((r = 1; r <= ROUNDS; r++)); do
  d="$OUT/r$r"
  mkdir -p "$d"
  for q in "${QUANTS[@]}"; do
    m="$MODELS/bench-$q.gguf"
    [[ -f "$m" ]] || { echo "missing $m" >&2; exit 1; }
    log_load "round $r llama.cpp $q"
    "$LLAMA_BENCH" -m "$m" -t "$THREADS" -p 512 -n 128 -r "$REPS" -o json >"$d/llamacpp-$q.json" 2>"$d/llamacpp-$q.stderr"
    if [[ "${LLAMA_REPACK0:-0}" == 1 ]]; then
      log_load "round $r llama.cpp --repack 0 $q"
      "$LLAMA_BENCH" -m "$m" -t "$THREADS" -p 512 -n 128 -r "$REPS" --repack 0 -o json >"$d/llamacpp_norepack-$q.json" 2>"$d/llamacpp_norepack-$q.stderr"
    fi
    log_load "round $r mlaserve $q"
    RAYON_NUM_THREADS="$THREADS" "$MLASERVE" bench --model "$m" -p 512 -n 128 -r "$REPS" --json >"$d/mlaserve-$q.json" 2>"$d/mlaserve-$q.stderr"
    if [[ -n "${BASELINE:-}" ]]; then
      log_load "round $r baseline $q"
      RAYON_NUM_THREADS="$THREADS" "$BASELINE" bench --model "$m" -p 512 -n 128 -r "$REPS" --json >"$d/baseline-$q.json" 2>"$d/baseline-$q.stderr"
    fi
  done
done
log_load "done"
