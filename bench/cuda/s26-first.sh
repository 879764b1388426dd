#!/usr/bin/env bash
# The next session's first device run, prepared in session 25: its last commit (f2e8205, the
# review: MLASERVE_QMMQ parsing, docs, the path unit test) changed no kernel code, but the whole
# op table last ran on 04e3c9a's kernels (run 4) and runs 5-6 ran the quantized family only.
# Whole op table, e2e, graphs; then the Q4_K model's replays at 3/4/8/16/64 rows and the bf16
# model's b1 (item 2's figure).
# On the build machine: cargo build ... && tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
(timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1;
 timeout 200 $B/synth_model v2-lite /tmp/v2-bf16.gguf > /dev/null 2>&1) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 240 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
timeout 100 $B/e2e --test-threads=2 --nocapture >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
grep -E "q4_k_m.gguf: |FAIL" $OUT/tests.txt >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
for b in 3 4 8 16 64; do
  echo "== q4k b$b: $(el)" >> $L
  timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done
for i in 1 2; do
  echo "== bf16 b1: $(el)" >> $L
  timeout 60 $B/decode_profile /tmp/v2-bf16.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
done
echo "end $(el)" >> $L
cat $L
