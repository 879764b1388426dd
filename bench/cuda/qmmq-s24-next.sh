#!/usr/bin/env bash
# The next session's device run for the int8 tensor-core kernels, prepared in session 23
# (bench/cuda/qgemv.md): MMQ_WARPS=8 (two warps a row group, each on half of a chunk's
# sub-blocks, summed through shared memory; compiled, never run — the default SASS is the one
# session 23 measured) tested and timed against the default, then Nsight Compute on both.
# On the build machine: cargo build ... && tools/device/pack.sh; cp this .device/next.sh
# On the device (carry .device): bash .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/mmq.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
W="-DMMQ_WARPS=8"   # the host reads the same variable: 256 threads a block
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
# compile both kernel sets first (~55 s each): the default's quantized family (session 23's
# review added moe_mmq rows with distinct experts, a null one, x in sorted order, and a
# 17,000-row matrix, never run on a GPU yet), then the variant's tests
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops-default.txt 2>&1
echo "ops quantized [default] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$W" MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized [$W] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$W" timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e [$W] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$W" timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs [$W] rc=$? $(el)" >> $L
for d in "" "$W"; do
  echo "== lab [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 90 $B/qgemv --shape 1,2,4,5 --m 2,8,16,64 --grouped 2>&1 | grep -E "^==|qgemm_mmq|mmq " >> $L
done
timeout 150 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1; echo "synth rc=$? $(el)" >> $L
for i in 1 2; do for b in 8 16 64; do for d in "" "$W"; do
  echo "== b$b [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
for d in "" "$W"; do
  env MLASERVE_KERNEL_DEFINES="$d" timeout 120 ncu --clock-control none -k regex:"qmmq_q4_k_n1|qmmq_q8_0_n1" -c 2 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis $B/qgemv --shape 2 --m 8 > "$OUT/ncu${d:+-w8}.txt" 2>&1
  echo "ncu [$d] rc=$? $(el)" >> $L
done
cat $L
