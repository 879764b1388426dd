#!/usr/bin/env bash
# CPU benchmark: mlaserve bench vs llama.cpp llama-bench on the same GGUF files, alternating
# engines per quant type so both see the same machine load. Raw JSON + load averages go to
# bench/cpu/raw/.
#
#   bench/cpu/run.sh [REPS] [QUANTS...]      e.g. bench/cpu/run.sh 5 Q8_0 Q4_K_M
#
# Env: MODELS (default /work/bench-models/dsv2-1b), LLAMA_BENCH, MLASERVE, THREADS (default 2),
#      LLAMA_EXTRA (default "--repack 0": with the CPU repack buffer type this llama.cpp build aborts
#      on this model with GGML_ASSERT(*cur_backend_id != -1) in ggml-backend.cpp:1294).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
MODELS="${MODELS:-/work/bench-models/dsv2-1b}"
LLAMA_BENCH="${LLAMA_BENCH:-/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}"
MLASERVE="${MLASERVE:-$REPO/target/release/mlaserve}"
THREADS="${THREADS:-2}"
LLAMA_EXTRA="${LLAMA_EXTRA---repack 0}"
REPS="${1:-5}"
shift || true
QUANTS=("${@:-Q8_0 Q4_K_M}")
# shellcheck disable=SC2206
QUANTS=(${QUANTS[*]})
OUT="${OUT:-$HERE/raw}"
mkdir -p "$OUT"

log_load() { echo "$(date -u +%FT%TZ) $1 $(uptime | sed 's/.*load average/load average/')" | tee -a "$OUT/load.log"; }

for q in "${QUANTS[@]}"; do
  m="$MODELS/bench-$q.gguf"
  [[ -f "$m" ]] || { echo "missing $m" >&2; exit 1; }
  log_load "before llama.cpp $q"
  "$LLAMA_BENCH" -m "$m" -t "$THREADS" -p 512 -n 128 -r "$REPS" $LLAMA_EXTRA -o json >"$OUT/llamacpp-$q.json" 2>"$OUT/llamacpp-$q.stderr"
  log_load "before mlaserve $q"
  RAYON_NUM_THREADS="$THREADS" "$MLASERVE" bench --model "$m" -p 512 -n 128 -r "$REPS" --json >"$OUT/mlaserve-$q.json" 2>"$OUT/mlaserve-$q.stderr"
  log_load "after $q"
done
