#!/usr/bin/env bash
# Session 25, run 5: large Q4_K matrices (>= 8 MiB) on the int8 tensor-core kernel from 3 rows
# (qmmq::QMMQ_Q4K_EARLY_M; was 5): quantized op family (with the paths' new references and the
# rewritten host layout of quantize_mmq_x), e2e, graphs; the lab at 2-4 rows (GEMV against
# qgemm_mmq, the executor's call); the Q4_K V2-Lite model's replays at 3 / 4 rows against
# MLASERVE_QMMQ=5 (from 5 rows everywhere, the old rule), 8 rows as a control.
# On the build machine: cargo build ... && LABS=1 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/early.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized rc=$? $(el)" >> $L
grep -E "quantize_mmq_x|qgemm int8 .*Q4K \[17000" $OUT/ops.txt | head -24 >> $L
grep -iE "fail|test result" $OUT/ops.txt | head -5 >> $L
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
echo "== lab: $(el)" >> $L
timeout 120 $B/qgemv --shape 0,1,2,4,5 --m 2,3,4 > $OUT/lab.txt 2>&1; echo "rc=$?" >> $L
grep -E "^==|^M[234] Q4K (qgemm_mmq|qmv|qgemm) " $OUT/lab.txt | grep -v '^|' >> $L
wait
for i in 1 2; do for b in 3 4 8; do for v in "" 5; do
  echo "== b$b QMMQ=${v:-rule}: $(el)" >> $L
  env ${v:+MLASERVE_QMMQ=$v} timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
