#!/usr/bin/env bash
# Session 25, run 2: Q4_K on the int8 tensor-core kernels against x quantized per 256 values
# (one scale a super-block: its sum in integers, the f32 work once a chunk; qmmq.cu's
# mmq_chunk_q4k) and Q8_0 without the min FFMA, against session 24's kernels (the _old
# binaries, b37742e) in one run: quantized op family, e2e, graphs, the qgemv lab, and the
# Q4_K V2-Lite model's replays at 8 / 16 / 64 rows.
# On the build machine: cargo build ... && LABS=1 OLD_QGEMV=/tmp/old/qgemv
#   OLD_PROFILE=/tmp/old/decode_profile tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/q4k.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized rc=$? $(el)" >> $L
grep -E "qgemm_mmq|moe_mmq|qgemm int8|tensor core" $OUT/ops.txt | grep Q4K | head -30 >> $L
grep -iE "fail|test result" $OUT/ops.txt | head -5 >> $L
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
for i in 1 2; do for v in "" _old; do
  echo "== lab$v: $(el)" >> $L
  timeout 150 $B/qgemv$v --shape 1,2,4,5 --m 2,4,8,16,32,64 --grouped 2>&1 | grep -E "^==|qgemm_mmq|mmq " | grep -v '^|' >> $L
done; done
for i in 1 2; do for b in 8 16 64; do for v in "" _old; do
  echo "== b$b$v: $(el)" >> $L
  timeout 60 $B/decode_profile$v /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
