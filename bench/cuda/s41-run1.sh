#!/usr/bin/env bash
# Session 41's run 1 (v2lite.md, "Forty-first session"): session 40's run 3 (s40-run3.sh) with
# one more lab build, -DMOE_CEARLY (moe-lab-s41.patch: the combine's first item, its first
# four K steps of both rows, loaded before the PDL wait: ids are final once the SwiGLU
# kernel's routed blocks have passed their wait; 61 registers, 4 blocks an SM).
# 1. The expert GEMVs' marginal cost in the b1 step on an H200 (MLASERVE_LAB_TWICE).
# 2. Lab builds in the step, two rounds interleaved with the landed: MOE_ROLL, MOE_G2,
#    MOE_CEARLY, MOE_CEARLY + MOE_ROLL; the moe op family under each.
# 3. read_bw's rows: the landed kernels (expert GEMVs, gemv_bf16_m1 on lm_head and layer 0's
#    MLP), and the expert rows under ROLL and CEARLY.
# Build machine: git apply bench/cuda/moe-lab-s41.patch; cargo build --release -p
# mlaserve-cuda --examples, synth_model, the ops test binary; read_bw, decode_profile,
# synth_model, ops packed by hand into .device/pkg/bins.tar.xz; git checkout the patch out;
# cp this .device/next.sh.
set -u
RUN=run1; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
VARS=("-DMOE_ROLL" "-DMOE_CEARLY" "-DMOE_CEARLY -DMOE_ROLL" "-DMOE_G2")
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
for v in "${VARS[@]}"; do  # (read_bw compiles as decode_profile does, without 31 GB a process)
  sleep 2; MLASERVE_KERNEL_DEFINES="$v" timeout 250 $B/read_bw > /dev/null 2>&1 &
done
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for k in moe_gemv_swiglu moe_gemv_combine; do
  echo "== b1 twice $k: $(MLASERVE_LAB_TWICE=$k rep) $(el)" >> $L
done
for r in 1 2; do
  echo "== b1 round $r landed: $(rep) $(el)" >> $L
  for v in "${VARS[@]}"; do
    echo "== b1 round $r [$v]: $(MLASERVE_KERNEL_DEFINES="$v" rep) $(el)" >> $L
  done
done
for v in "${VARS[@]}"; do
  MLASERVE_OPS=moe MLASERVE_KERNEL_DEFINES="$v" timeout 100 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
  echo "== ops moe [$v] rc=$? $(el)" >> $L; grep -E "rows|test result|FAIL" $OUT/ops.txt | tail -3 >> $L
done
echo "== read_bw (landed kernels)" >> $L
timeout 100 $B/read_bw 2>&1 | grep -E "lab_read_u4 x 8|lab_copy|swiglu|moe_|gemv_bf16|sink" >> $L
for v in "-DMOE_ROLL" "-DMOE_CEARLY"; do
  echo "== read_bw [$v]: its expert rows" >> $L
  MLASERVE_KERNEL_DEFINES="$v" timeout 100 $B/read_bw 2>&1 | grep -E "moe_|sink" >> $L
done
echo "end $(el)" >> $L
cat $L
