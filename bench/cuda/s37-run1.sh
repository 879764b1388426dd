#!/usr/bin/env bash
# Session 37, run 1: session 36's cuts of mla_attn_cl again (its raw output was lost with the
# build machine's workspace; `attn-exposed-s36.patch`'s MAC_LAB_SKIP), one more cut, and a
# timeline of the last layer's kernels around the attention (`timeline-s37.patch`):
#   MAC_LAB_NOW       the attention without its weight loads (zeros: wrong outputs, the same
#                     work otherwise): what loading W_UK_T / W_UV's 32 KB a block costs the step;
#   MLA_LAB_TL        thread 0 of every block writes %globaltimer at its start, after its PDL
#                     wait and at its end, with its SM, for the q|kv_a GEMV (grid 228), the
#                     attention, the o_proj GEMV (grid 128) and the routing's start and wait;
#                     decode_profile dumps the last replay's stamps raw (MLASERVE_TL_DUMP), which
#                     bench/cuda/timeline_s37.py reads on the build machine;
#   MLASERVE_GEMV_PF_ATTN=1  (`gemv-pf-attn-s37.patch`) the q|kv_a GEMV requests the layer's
#                     W_UK_T and W_UV (4 MB) into L2 before its wait, for the attention after it.
# Build machine: git apply the three patches; the usual builds; LABS=0 tools/device/pack.sh;
#   cp this .device/next.sh; afterwards git checkout the kernel files and decode_profile.rs.
# The dumps ($OUT/tl-*.bin) are kept gzipped as bench/cuda/s37/run1-tl-*.bin.gz.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
V=("" "-DMAC_LAB_SKIP=0" "-DMAC_LAB_SKIP=1" "-DMAC_LAB_NOW")
T=("-DMLA_LAB_TL" "-DMLA_LAB_TL -DMAC_LAB_SKIP=0")
# Compile every build at once: a process that runs out of GPU memory after compiling has
# still filled the kernel cache.
for d in "${V[@]}" "${T[@]}"; do
  MLASERVE_KERNEL_DEFINES="$d" timeout 300 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
  sleep 4
done
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for d in "${V[@]}"; do
    echo "== b1 round $r [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep) $(el)" >> $L
  done
  echo "== b1 round $r [PF_ATTN]: $(MLASERVE_GEMV_PF_ATTN=1 rep) $(el)" >> $L
done
for r in 1 2; do
  i=0
  for d in "${T[@]}"; do
    f=$OUT/tl-$i-$r.bin
    echo "== timeline $r [$d] -> $(basename $f): $(MLASERVE_TL_DUMP=$f MLASERVE_KERNEL_DEFINES="$d" rep) $(el)" >> $L
    i=$((i + 1))
  done
  f=$OUT/tl-pf-$r.bin
  echo "== timeline $r [PF_ATTN ${T[0]}] -> $(basename $f): $(MLASERVE_GEMV_PF_ATTN=1 MLASERVE_TL_DUMP=$f MLASERVE_KERNEL_DEFINES="${T[0]}" rep) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
