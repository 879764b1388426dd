#!/usr/bin/env bash
# Session 25, run 6: the int8 kernels' x staging unrolled for their 128 threads (no loop a
# stage: Q4_K's chunk 405 -> 362 instructions, n1) with register bounds holding the 2-tile
# kernels to 4 blocks an SM and the 4-tile ones to 3, against 04e3c9a's kernels (_old):
# quantized op family, e2e, graphs, the lab, the Q4_K V2-Lite model's replays at 8/16/64 rows.
# On the build machine: cargo build ... && LABS=1 OLD_QGEMV=/tmp/old2/qgemv
#   OLD_PROFILE=/tmp/old2/decode_profile tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/stage.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized rc=$? $(el)" >> $L
grep -iE "fail|test result" $OUT/ops.txt | head -5 >> $L
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
for v in "" _old; do
  echo "== lab$v: $(el)" >> $L
  timeout 120 $B/qgemv$v --shape 1,2,4,5 --m 2,8,16,32,64 --grouped > $OUT/lab$v.txt 2>&1; echo "rc=$?" >> $L
  grep -E "^==|qgemm_mmq|mmq " $OUT/lab$v.txt | grep -v '^|' >> $L
done
wait
for b in 8 16 64; do for v in "" _old; do
  echo "== b$b$v: $(el)" >> $L
  timeout 60 $B/decode_profile$v /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done
echo "end $(el)" >> $L
cat $L
