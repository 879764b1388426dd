#!/usr/bin/env bash
# Session 40's run 3 (v2lite.md, "Fortieth session"): the expert GEMVs' marginal cost in the
# b1 step on an H200 (run 2's were an H100's: 96% and 92% of its read ceiling), and MOE_G2 in
# the step on an H200. Not yet run.
# Build machine: git apply bench/cuda/moe-lab-s40.patch, then as s40-run1.sh (decode_profile,
# read_bw, synth_model packed by hand).
set -u
RUN=run3; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2; MLASERVE_KERNEL_DEFINES="-DMOE_G2" timeout 250 $B/read_bw > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r landed: $(rep) $(el)" >> $L
  echo "== b1 round $r [-DMOE_G2]: $(MLASERVE_KERNEL_DEFINES=-DMOE_G2 rep) $(el)" >> $L
done
for k in moe_gemv_swiglu moe_gemv_combine; do
  echo "== b1 twice $k: $(MLASERVE_LAB_TWICE=$k rep) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
