#!/usr/bin/env bash
# On the GPU machine (run from the repository root, `.device` carried; see pack.sh): the op
# table, e2e and graph tests, then V2-Lite-shaped decode benchmarks of the variants given as
# arguments, each `name[:VAR=value,...]` (binary `mlaserve`, or `mlaserve_old` for a name
# starting with "old"), all in the same run, and decode profiles (this build). Results in
# $OUT: tests.txt, ops-report.json, e2e-report.json, bench.txt, profile_b<B>.{txt,json}.
#   bash .device/decode_ab.sh new old new:MLASERVE_FUSE_SHARED=0 new2
# Env: BATCHES (default 1,2,4,16), TESTS=0 to skip the tests, TYPE=q4_k|q8_0 for the model,
# PROMPT (default 512 tokens), PROFILE_BATCHES (default "1"; e.g. "1 4"; " " for none).
# bench.txt is appended to, so several calls can share one run. At most 8 files come back.
set -uo pipefail
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }   # the tests find fixtures there
export MLASERVE_KERNEL_CACHE=/tmp/kc
S=$(date +%s)
el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> "$OUT/tests.txt"
if [ "${TESTS:-1}" != 0 ]; then
    MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 150 "$B/ops" --test-threads=1 >> "$OUT/tests.txt" 2>&1
    echo "ops rc=$? $(el)" >> "$OUT/tests.txt"
    MLASERVE_E2E_REPORT=$OUT/e2e-report.json timeout 200 "$B/e2e" --test-threads=2 >> "$OUT/tests.txt" 2>&1
    echo "e2e rc=$? $(el)" >> "$OUT/tests.txt"
    timeout 90 "$B/graphs" --test-threads=1 >> "$OUT/tests.txt" 2>&1
    echo "graphs rc=$? $(el)" >> "$OUT/tests.txt"
fi
model=/tmp/v2-${TYPE:-bf16}.gguf
[ -e "$model" ] || "$B/synth_model" v2-lite "$model" ${TYPE:+--type $TYPE} > /dev/null 2>&1
echo "synth $(el)" >> "$OUT/tests.txt"
for v in "$@"; do
    name=${v%%:*}
    vars=(); [ "$name" != "$v" ] && IFS=, read -ra vars <<< "${v#*:}"
    bin=mlaserve; case $name in old*) bin=mlaserve_old ;; esac
    echo "== $v ${TYPE:-bf16} p${PROMPT:-512} ($(el))" >> "$OUT/bench.txt"
    env ${vars[@]+"${vars[@]}"} "$B/$bin" bench --model "$model" --device cuda -b "${BATCHES:-1,2,4,16}" \
        -p "${PROMPT:-512}" -n 64 -r 3 2>&1 | grep -E '^\| .*tg|rror|panic' >> "$OUT/bench.txt"
done
for b in ${PROFILE_BATCHES:-1}; do
    timeout 60 "$B/decode_profile" "$model" --batch "$b" --json "$OUT/profile_b$b.json" \
        > "$OUT/profile_b$b.txt" 2>&1
done
echo "end $(el)" >> "$OUT/bench.txt"
