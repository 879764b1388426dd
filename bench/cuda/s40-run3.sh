#!/usr/bin/env bash
# Session 40's run 3 (v2lite.md, "Fortieth session"), prepared and NOT RUN (the session's device
# time ran out): for the next session's first H200 run.
# 1. The expert GEMVs' marginal cost in the b1 step on an H200 (MLASERVE_LAB_TWICE): run 2's
#    were an H100's, 96% and 92% of its read ceiling; session 18's H200 figures (an older
#    build) were 83-84% of the H200's (run 1: 4.59 TB/s) — up to ~115-160 µs a step left.
# 2. Two lab builds of the expert GEMVs in the step, two rounds interleaved with the landed:
#    -DMOE_G2 (a warp two rows; run 2 on an H100: 0.9 µs faster alone, +14 µs in the step) and
#    -DMOE_ROLL (each step's registers load the step 4 further on as soon as its products are
#    taken, so a warp's second batch is requested during its first batch's arithmetic — run
#    2 found the arithmetic 2.5 of the 3.6 µs swiglu loses to its loads; the same registers,
#    4 blocks an SM: swiglu 62, combine 56; the same sums in the same order). Each: the moe op
#    family under it, read_bw's expert rows.
# 3. read_bw's dense GEMV rows (new after run 2): gemv_bf16_m1 on lm_head (419 MB, one launch
#    a step) and layer 0's MLP, against the read ceiling.
# Build machine: git apply bench/cuda/moe-lab-s40.patch; cargo build --release -p mlaserve-cuda
# --examples, synth_model, the ops test binary; read_bw, decode_profile, synth_model, ops
# packed by hand into .device/pkg/bins.tar.xz; git checkout the patch out; cp this
# .device/next.sh.
set -u
RUN=run3; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
VARS=("-DMOE_ROLL" "-DMOE_G2")
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
echo "== read_bw (landed kernels): its expert rows" >> $L
timeout 150 $B/read_bw 2>&1 | grep -E "lab_read_u4 x 8|lab_copy|swiglu|moe_|gemv_bf16|sink" >> $L
for v in "${VARS[@]}"; do
  echo "== read_bw [$v]: its expert rows" >> $L
  MLASERVE_KERNEL_DEFINES="$v" timeout 150 $B/read_bw 2>&1 | grep -E "moe_|sink" >> $L
  MLASERVE_OPS=moe MLASERVE_KERNEL_DEFINES="$v" timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
  echo "== ops moe [$v] rc=$? $(el)" >> $L; grep -E "rows|test result|FAIL" $OUT/ops.txt | tail -3 >> $L
done
echo "end $(el)" >> $L
cat $L
