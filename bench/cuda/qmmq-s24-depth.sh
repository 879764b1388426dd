#!/usr/bin/env bash
# Session 24, run 3: the int8 tensor-core kernels with more chunks of weights in flight a warp
# (MMQ_DEPTH_Q4K / MMQ_DEPTH_Q8, qmmq.cu; default 2 = one chunk ahead, the SASS of session 23),
# tested (quantized op family, e2e, graphs) and timed against the default in one binary.
# On the build machine: cargo build ... && tools/device/pack.sh; cp this .device/next.sh
# On the device (carry .device): bash .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/depth.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
V1="-DMMQ_DEPTH_Q4K=3 -DMMQ_DEPTH_Q8=3"; V2="-DMMQ_DEPTH_Q4K=4"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
for d in "$V1" "$V2"; do
  env MLASERVE_KERNEL_DEFINES="$d" MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > "$OUT/ops${d:16:1}.txt" 2>&1
  echo "ops quantized [$d] rc=$? $(el)" >> $L
  grep -iE "fail" "$OUT/ops${d:16:1}.txt" | head -5 >> $L
done
env MLASERVE_KERNEL_DEFINES="$V1" timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e [$V1] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$V1" timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs [$V1] rc=$? $(el)" >> $L
wait
for d in "" "$V1" "$V2"; do
  echo "== lab [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/qgemv --shape 1,2,4,5 --m 2,4,8,16,64 --grouped 2>&1 | grep -E "^==|qgemm_mmq|mmq " | grep -v '^|' >> $L
done
for i in 1 2; do for b in 8 16 64; do for d in "" "$V1" "$V2"; do
  echo "== b$b [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
