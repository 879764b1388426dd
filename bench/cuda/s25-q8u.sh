#!/usr/bin/env bash
# Session 25, run 3: Q4_K on the int8 tensor-core kernels against x quantized by the q8u rule
# (a scale a 256-value chunk, an integer factor 1-8 a sub-block: the super-block's sum in
# integers; run 2's one scale a chunk cost the GLM-DSA Q4_K_M fixture's argmax agreement,
# 0.886 -> 0.827) and Q8_0 without the min FFMA, against b37742e's kernels (_old binaries):
# quantized op family (with the bit-exact quantize_mmq_x rows), e2e, graphs, the qgemv lab
# (full output kept: run 2's first lab round stopped at o_proj M64 Q4_K without a visible
# message), the Q4_K V2-Lite model's replays at 8 / 16 / 64 rows.
# On the build machine: cargo build ... && LABS=1 OLD_QGEMV=/tmp/old/qgemv
#   OLD_PROFILE=/tmp/old/decode_profile tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/q8u.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized rc=$? $(el)" >> $L
grep -E "quantize_mmq_x|qgemm_mmq .*M(8|64) |moe_mmq" $OUT/ops.txt | head -40 >> $L
grep -iE "fail|test result" $OUT/ops.txt | head -5 >> $L
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
grep -E "q4_k|q8_0|FAIL" $OUT/e2e.txt >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
n=0; for v in "" _old ""; do
  n=$((n + 1)); echo "== lab$v ($n): $(el)" >> $L
  timeout 150 $B/qgemv$v --shape 1,2,4,5 --m 2,4,8,16,32,64 --grouped > $OUT/lab$n.txt 2>&1
  echo "rc=$?" >> $L
  grep -E "^==|qgemm_mmq|mmq " $OUT/lab$n.txt | grep -v '^|' >> $L
done
for i in 1 2; do for b in 8 16 64; do for v in "" _old; do
  echo "== b$b$v: $(el)" >> $L
  timeout 60 $B/decode_profile$v /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
