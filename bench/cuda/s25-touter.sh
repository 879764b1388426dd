#!/usr/bin/env bash
# Session 25, run 4: the q8u build (run 3) through the whole op table (ops-report.json), e2e
# with its rows printed (the Q4_K_M fixture's agreement) and graphs; then mmq_chunk_q4k with
# the x tiles outermost from 4 tiles (-DMMQ_TOUTER=4: the 8-tile kernels at 168 registers, not
# 255, so 3 blocks an SM) against the default: quantized op family under the define, the lab
# at 8-64 rows, the Q4_K V2-Lite model's replays at 16 / 64 rows.
# On the build machine: cargo build ... && LABS=1 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/touter.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
V="-DMMQ_TOUTER=4"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 200 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
timeout 100 $B/e2e --test-threads=2 --nocapture >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
grep -E "q4_k|q8_0|FAIL" $OUT/tests.txt >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$V" MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops-touter.txt 2>&1
echo "ops quantized [$V] rc=$? $(el)" >> $L
grep -iE "fail|test result" $OUT/ops-touter.txt | head -5 >> $L
wait
for d in "" "$V" ""; do
  echo "== lab [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/qgemv --shape 2,4,5 --m 8,16,32,64 --grouped 2>&1 | grep -E "^==|Q4K qgemm_mmq|Q4K mmq " | grep -v '^|' >> $L
done
for i in 1 2; do for b in 16 64; do for d in "" "$V"; do
  echo "== b$b [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
