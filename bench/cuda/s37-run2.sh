#!/usr/bin/env bash
# Session 37, run 2. Run 1's timeline: the attention's blocks begin only as the q|kv_a GEMV's
# blocks leave (the GEMV's 228 blocks of 123 registers hold its whole K in registers before
# its wait: ~30 MB of the 33 MB register file), so the attention's 4 µs before its wait is on
# the step's path. `gemv-lo-s37.patch` adds gemv_bf16_m1lo, the q|kv_a call's GEMV with
# GEMV_LAB_LO K steps (default 1) before its wait, picked under MLASERVE_GEMV_LO=1;
# GEMV_LAB_LO_BLOCKS=4 caps it at 64 registers (no spills), so two GEMV blocks and one
# attention block (124 registers) fit an SM's 64 K registers. Does the attention then begin
# during the GEMV, and what does the step say? Timelines as run 1 (MLA_LAB_TL).
# Build machine: git apply attn-exposed-s36, timeline-s37, gemv-pf-attn-s37 and gemv-lo-s37
# patches; the usual builds; LABS=0 tools/device/pack.sh; cp this .device/next.sh.
# The dumps are kept gzipped as bench/cuda/s37/run2-tl-*.bin.gz.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
V=("" "-DGEMV_LAB_LO_BLOCKS=4" "-DGEMV_LAB_LO=2 -DGEMV_LAB_LO_BLOCKS=4")
for d in "${V[@]}"; do
  for t in "" "-DMLA_LAB_TL"; do
    MLASERVE_KERNEL_DEFINES="$d $t" timeout 300 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
    sleep 4
  done
done
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r landed GEMV: $(rep) $(el)" >> $L
  echo "== b1 round $r LO=1, 80 registers: $(MLASERVE_GEMV_LO=1 rep) $(el)" >> $L
  for d in "${V[@]:1}"; do
    echo "== b1 round $r LO [$d]: $(MLASERVE_GEMV_LO=1 MLASERVE_KERNEL_DEFINES="$d" rep) $(el)" >> $L
  done
done
for r in 1 2; do
  f=$OUT/tl-0-$r.bin
  echo "== timeline $r landed GEMV -> $(basename $f): $(MLASERVE_TL_DUMP=$f MLASERVE_KERNEL_DEFINES=" -DMLA_LAB_TL" rep) $(el)" >> $L
  i=1
  for d in "${V[@]:1}"; do
    f=$OUT/tl-$i-$r.bin
    echo "== timeline $r LO [$d] -> $(basename $f): $(MLASERVE_GEMV_LO=1 MLASERVE_TL_DUMP=$f MLASERVE_KERNEL_DEFINES="$d -DMLA_LAB_TL" rep) $(el)" >> $L
    i=$((i + 1))
  done
done
echo "end $(el)" >> $L
cat $L
