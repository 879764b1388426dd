#!/usr/bin/env bash
# Prepared in session 41 for the next session's first device run. RAN in session 43 (06:04 UTC,
# an H100: v2lite-s43-run1.txt); the patch landed as 8816e75 and its file is gone (the build
# below: b3710df with it applied = 8816e75's kernels). Session 42's twenty calls were all
# refused. Run with s42-run2.sh in the same call:
# (bash .device/next.sh > /dev/null; cat $OUT/first.txt; bash .device/run2.sh): ~310 s.
# 1. Item 2 on an H200 at last: the bf16 b1 step with 1ed4af7's early combine against itself
#    with MLASERVE_COMBINE_EARLY=0 (b117da5's step: session 41's run 2 measured the two equal,
#    2,277.7 against 2,278.4 µs on an H100), two rounds.
# 2. qmv-pairs-early-s41.patch: the quantized expert down GEMV (qmv_pairs after the gate|up
#    pairs over the same ids) looks its matrices up and requests its first steps before its
#    PDL wait, as the bf16 combine now does — the Q4_K V2-Lite model's b1/b2 steps against
#    MLASERVE_QMV_PAIRS_EARLY=0, two rounds. Predicted: ~1-2 µs a MoE layer, as the bf16
#    combine's −1.8 (26 layers: −25 to −50 µs a b1 step). Its registers (nvrtc_check): the
#    qmv kernels within their launch bounds' occupancy (r4m1w 114 -> 121, r2m8 119 -> 123, the
#    rest ±2), so the dense GEMVs' SASS moved a little too: the knob-off rounds are the control.
# 3. The quantized and moe op families (the new "ids final" qmv_pairs row: 0 bits differ;
#    session 41's n = 1,408 combine rows), the moe family again under MLASERVE_COMBINE_ROWS=8
#    (the r8 combine: its early path has not run on a GPU), e2e, graphs.
# Build machine: git apply bench/cuda/qmv-pairs-early-s41.patch; cargo build --release -p
# mlaserve-cuda --examples; cargo build --release -p mlaserve-model --example synth_model;
# cargo test --release -p mlaserve-cuda --no-run; pack decode_profile, synth_model, ops, e2e,
# graphs, read_bw (for s42-run2.sh) (strip; XZ_OPT=-9e tar -cJf .device/pkg/bins.tar.xz); cp this .device/next.sh.
set -u
RUN=${RUN:-first}; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
(timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L) &
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
MLASERVE_OPS=quantized,moe timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops quantized,moe rc=$? $(el)" >> $L; grep -E "ids final|rows|test result|FAIL" $OUT/ops.txt | tail -6 >> $L
# the 8-rows-a-block combine (moe_gemv_combine_r8, chosen per process) through the same rows
MLASERVE_COMBINE_ROWS=8 MLASERVE_OPS=moe timeout 100 $B/ops --test-threads=1 --nocapture > $OUT/ops-r8.txt 2>&1
echo "== ops moe COMBINE_ROWS=8 rc=$? $(el)" >> $L; grep -E "rows|test result|FAIL" $OUT/ops-r8.txt | tail -3 >> $L
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== bf16 b1 round $r: $(rep $M 1 X=1) $(el)" >> $L
  echo "== bf16 b1 round $r COMBINE_EARLY=0: $(rep $M 1 MLASERVE_COMBINE_EARLY=0) $(el)" >> $L
  for b in 1 2; do
    echo "== q4k b$b round $r: $(rep $Q $b X=1) $(el)" >> $L
    echo "== q4k b$b round $r PAIRS_EARLY=0: $(rep $Q $b MLASERVE_QMV_PAIRS_EARLY=0) $(el)" >> $L
  done
done
timeout 150 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
timeout 80 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "== graphs rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
echo "end $(el)" >> $L
cat $L
