#!/usr/bin/env bash
# Session 44's third device call: the lm_head on the one-row GEMV by default (at one token;
# `MLASERVE_LM_HEAD_GEMV=0` is cuBLAS). Runs 1-2 (an H100) measured it −5.5 µs a bf16 b1 step.
# 1. The gemms op family (its new row: the GEMV over 100,003 rows, an lm_head's grid), e2e,
#    graphs — on any card.
# 2. On an H200 (item 2's card; no figure since session 40's 1,802 µs): the bf16 b1 step against
#    MLASERVE_LM_HEAD_GEMV=0 and MLASERVE_COMBINE_EARLY=0, the Q4_K b1 step against
#    MLASERVE_QMV_PAIRS_EARLY=0, two rounds; then the bf16 step's marginals and read_bw.
# Pack: this build (decode_profile, synth_model, read_bw, ops, e2e, graphs); carry [".device"],
# `bash .device/run3.sh`.
set -u
RUN=run3; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
h200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
(timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L) &
MLASERVE_OPS=gemms timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops gemms rc=$? $(el)" >> $L; grep -E "100003|rows|test result|FAIL" $OUT/ops.txt | tail -8 >> $L
wait
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 > $OUT/profile-b1.txt 2>&1; echo "== compiled, profile rc=$? $(el)" >> $L
rep() { m=$1; shift; timeout 90 env "$@" $B/decode_profile $m --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
if [ $h200 = 1 ]; then
  timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L
  for r in 1 2; do
    echo "== bf16 b1 round $r: $(rep $M X=1) $(el)" >> $L
    echo "== bf16 b1 round $r LM_HEAD_GEMV=0: $(rep $M MLASERVE_LM_HEAD_GEMV=0) $(el)" >> $L
    echo "== bf16 b1 round $r COMBINE_EARLY=0: $(rep $M MLASERVE_COMBINE_EARLY=0) $(el)" >> $L
    echo "== q4k b1 round $r: $(rep $Q X=1) $(el)" >> $L
    echo "== q4k b1 round $r PAIRS_EARLY=0: $(rep $Q MLASERVE_QMV_PAIRS_EARLY=0) $(el)" >> $L
  done
else
  for r in 1 2; do
    echo "== bf16 b1 round $r: $(rep $M X=1) $(el)" >> $L
    echo "== bf16 b1 round $r LM_HEAD_GEMV=0: $(rep $M MLASERVE_LM_HEAD_GEMV=0) $(el)" >> $L
  done
fi
timeout 150 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
timeout 80 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "== graphs rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
if [ $h200 = 1 ]; then
  for k in $(grep -E '^\| [a-z_0-9]+ \|' $OUT/profile-b1.txt | grep -vE '^\| (gemm|label) ' | awk '{print $2}' | head -5); do
    echo "== twice $k: $(rep $M MLASERVE_LAB_TWICE=$k) $(el)" >> $L
  done
  echo "== plain: $(rep $M X=1) $(el)" >> $L
  timeout 100 $B/read_bw 2>&1 | grep -E "lab_read_u4 x 8|lab_copy|moe_|gemv_bf16|swiglu" >> $L
fi
echo "end $(el)" >> $L
cat $L; head -16 $OUT/profile-b1.txt
