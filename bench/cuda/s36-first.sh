#!/usr/bin/env bash
# Prepared in session 35, run as session 36's first run (figures in v2lite.md, the raw output
# lost; session 37's s37-run1.sh measured the cuts again): what each part of mla_attn_cl
# costs the b1 step. Session 35 found that the kernel's phase medians do not predict the step
# (a column split that removed two of four cluster exchanges was +34 µs; three shorter
# pre-wait chains moved nothing), so this cuts the kernel short at three points and lets the
# step say what is left: `attn-exposed-s36.patch` (the landed SASS unchanged without the
# define: md5 compared on the build machine) adds MAC_LAB_SKIP —
#   0  no work: the PDL wait and the launch's hand-offs only (out gets a zero contribution);
#   1  the pre-wait work (weights into registers, the first chunk's copies completed);
#   2  everything through the LSE merge (o_lat), no W_UV and no output exchange;
# the same output rows written as zeros (o_proj then adds nothing; the routing sees the same
# residual, so the expert traffic stays the step's). step(default) - step(SKIP=k) is what the
# work after cut k costs the step; MLASERVE_CLUSTER_ATTN=0 (the three launches) for reference.
# Build machine: git apply bench/cuda/attn-exposed-s36.patch; the usual builds;
#   OLD_PROFILE= not needed; LABS=0 tools/device/pack.sh; cp this .device/next.sh;
#   after the run: git checkout crates/cuda/kernels/mla_attn_cl.cu
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
V=("" "-DMAC_LAB_SKIP=0" "-DMAC_LAB_SKIP=1" "-DMAC_LAB_SKIP=2")
# Compile the four builds at once: a process that runs out of GPU memory after compiling
# has still filled the kernel cache.
for d in "${V[@]}"; do
  MLASERVE_KERNEL_DEFINES="$d" timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
  sleep 20
done
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for d in "${V[@]}"; do
    echo "== b1 round $r [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep) $(el)" >> $L
  done
  echo "== b1 round $r three launches: $(MLASERVE_CLUSTER_ATTN=0 rep) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
