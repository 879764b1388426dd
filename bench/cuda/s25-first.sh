#!/usr/bin/env bash
# The next session's first device run, prepared in session 24: its last commits were not run on
# a GPU — the review's fence_hnb (moe_norm_route_cl fences hnb only under `late` bit 2, set
# where the GEMV after it skips its wait), x_early on sm_90+ only, and the new op row
# "after moe_norm_route_cl, slices without the wait x200". Whole op table, e2e, graphs, then
# b1/b2/b4 replays against MLASERVE_SHARED_NOWAIT=0 (b2-b4 no longer pay the fence).
# On the build machine: cargo build ... && tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 120 $B/synth_model v2-lite /tmp/v2-bf16.gguf > /dev/null 2>&1 &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 240 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "slices without the wait|moe_route_nowait|test result" $OUT/tests.txt >> $L
timeout 100 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
for i in 1 2; do for b in 1 2 4; do for v in "" 0; do
  echo "== b$b SHARED_NOWAIT=${v:-default}: $(el)" >> $L
  env ${v:+MLASERVE_SHARED_NOWAIT=$v} timeout 60 $B/decode_profile /tmp/v2-bf16.gguf --batch $b --replays 300 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
