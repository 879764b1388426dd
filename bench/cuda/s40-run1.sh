#!/usr/bin/env bash
# Session 40's run 1 (v2lite.md, "Fortieth session"): the GPU's read ceiling, and how close
# the b1 step's expert GEMVs stream to it. Ran 22:46 UTC on an H200 (v2lite-s40-run1.txt):
# reads 4.47-4.59 TB/s over 1 GiB, 4.0-4.28 over 92 MB; the copy 3.90; the expert GEMV's
# access pattern 4,276 GB/s, moe_gemv_swiglu 3,551, moe_gemv_combine 3,009; the three lab
# builds slower in the step (1,802 landed; 2,040 / 1,813 / 1,821). Their defines are
# moe-lab-s40.patch (git apply it first; the landed SASS is unchanged without them).
# Issue #11's roofline divides the step's 4.90 GB by the device copy's 3,970 GB/s (bytes read
# + written); the expert GEMVs (moe_gemv_swiglu 92 MB, moe_gemv_combine 46 MB a MoE layer:
# with layer 0's MLP and lm_head ~85% of the step's bytes) stream within ~5% of that copy.
# If a kernel that only reads streams faster than a copy, they have that much left: at
# 4.3 TB/s, ~100 µs a step, most of item 2's 162 µs.
# 1. examples/read_bw (the landed kernels): pure reads, the GEMV's access pattern without
#    arithmetic, the copy, the two expert GEMVs alone and as the step's pair.
# 2. Three lab builds of the expert GEMVs (NVRTC defines; the landed kernels' SASS unchanged
#    without them): 8 K steps in flight a warp (-DMOE_STEPS=8; 4 landed), the weights by
#    ld.global.nc (-DMOE_LD=1), and with L1::no_allocate and an L2 256-byte prefetch
#    (-DMOE_LD=2). Each: the moe op family under it, read_bw's expert rows, and the b1 step
#    (decode_profile, 300 replays, two rounds interleaved with the landed build).
# Build machine: cargo build --release -p mlaserve-cuda --examples, synth_model, the ops test
# binary; read_bw, decode_profile, synth_model, ops packed by hand into .device/pkg/bins.tar.xz;
# cp this .device/next.sh.
set -u
RUN=run1; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
VARS=("-DMOE_STEPS=8" "-DMOE_LD=1" "-DMOE_LD=2")
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
for v in "${VARS[@]}"; do
  sleep 2; MLASERVE_KERNEL_DEFINES="$v" timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
done
wait; echo "== compiled $(el)" >> $L
echo "== read_bw (landed kernels)" >> $L
timeout 150 $B/read_bw >> $L 2>&1; echo "rc=$? $(el)" >> $L
for v in "${VARS[@]}"; do
  echo "== read_bw [$v]: its expert rows" >> $L
  MLASERVE_KERNEL_DEFINES="$v" timeout 150 $B/read_bw 2>&1 | grep -E "moe_|swiglu|sink" >> $L
  MLASERVE_OPS=moe MLASERVE_KERNEL_DEFINES="$v" timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops-moe$v.txt 2>&1
  echo "== ops moe [$v] rc=$? $(el)" >> $L; grep -E "rows|test result|FAIL" $OUT/ops-moe$v.txt | tail -4 >> $L
done
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r landed: $(rep) $(el)" >> $L
  for v in "${VARS[@]}"; do
    echo "== b1 round $r [$v]: $(MLASERVE_KERNEL_DEFINES="$v" rep) $(el)" >> $L
  done
done
echo "end $(el)" >> $L
cat $L
