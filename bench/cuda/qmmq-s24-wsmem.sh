#!/usr/bin/env bash
# Session 24, run 5: Q4_K's weights through the int8 kernels' shared-memory ring
# (-DMMQ_Q4K_SMEM: coalesced 16-byte copies of each row's 144-byte super-block, whole sectors),
# tested (quantized op family, e2e, graphs) and timed against the default in one binary.
# On the build machine: cargo build ... && tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/wsmem.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
V="-DMMQ_Q4K_SMEM"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
env MLASERVE_KERNEL_DEFINES="$V" MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized [$V] rc=$? $(el)" >> $L; grep -E "test result" $OUT/ops.txt >> $L
env MLASERVE_KERNEL_DEFINES="$V" timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e [$V] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$V" timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs [$V] rc=$? $(el)" >> $L
for d in "" "$V"; do
  echo "== lab [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/qgemv --shape 0,2,4,5 --m 2,8,16,64 --grouped 2>&1 | grep -E "^==|Q4K qgemm_mmq|Q4K mmq " | grep -v '^|' >> $L
done
wait
for i in 1 2; do for b in 8 16 64; do for d in "" "$V"; do
  echo "== b$b [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
