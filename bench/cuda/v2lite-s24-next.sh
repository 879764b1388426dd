#!/usr/bin/env bash
# A next device run for item 2, prepared in session 23 (bench/cuda/v2lite.md): the shared
# experts' gate|up blocks of moe_gemv_swiglu reading hnb without waiting for the routing
# (`-DMOE_SHARED_EARLY`: moe_norm_route_cl fences at gpu scope before letting the GEMV in;
# the slices' blocks copy their x row with ld.global.cg, run and exit; the routed blocks still
# wait). Compiled, never run; the default SASS of both kernels is unchanged.
# On the build machine: cargo build ... && LABS=0 tools/device/pack.sh; cp this .device/next.sh
# On the device (carry .device): bash .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/early.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
E="-DMOE_SHARED_EARLY"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
# The moe op family (its "slices without the wait" row takes the early path under the define),
# e2e and graph tests (the executor's fused route, then the GEMV without the wait), the variant.
env MLASERVE_KERNEL_DEFINES="$E" MLASERVE_OPS=moe timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops moe [$E] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$E" timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e [$E] rc=$? $(el)" >> $L
env MLASERVE_KERNEL_DEFINES="$E" timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs [$E] rc=$? $(el)" >> $L
timeout 60 $B/synth_model v2-lite /tmp/v2-bf16.gguf > /dev/null 2>&1; echo "synth $(el)" >> $L
for i in 1 2 3; do for d in "" "$E"; do
  echo "== [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/decode_profile /tmp/v2-bf16.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
done; done
grep -E "without the wait|FAIL|fail" $OUT/ops.txt | head >> $L
echo "end $(el)" >> $L
cat $L
