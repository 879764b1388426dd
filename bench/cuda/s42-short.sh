#!/usr/bin/env bash
# NOT RUN (session 42: no machine was lent; session 43 ran s42-first.sh whole; the patch landed as 8816e75 and its file is gone). s42-first.sh cut down for a session with little
# device time left: the Q4_K model's b1/b2 steps with qmv-pairs-early-s41.patch against
# MLASERVE_QMV_PAIRS_EARLY=0 first (the decision), then the quantized op family (the "ids
# final" row), e2e, graphs, and the bf16 b1 step against MLASERVE_COMBINE_EARLY=0 last.
# Build machine: as s42-first.sh (the same pack).
set -u
RUN=short; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
(timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth bf16 $(el)" >> $L) &
timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r PAIRS_EARLY=0: $(rep $Q 1 MLASERVE_QMV_PAIRS_EARLY=0) $(el)" >> $L
done
wait
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops quantized rc=$? $(el)" >> $L; grep -E "ids final|rows|test result|FAIL" $OUT/ops.txt | tail -6 >> $L
timeout 150 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
timeout 80 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "== graphs rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
echo "== q4k b2: $(rep $Q 2 X=1) / PAIRS_EARLY=0 $(rep $Q 2 MLASERVE_QMV_PAIRS_EARLY=0) $(el)" >> $L
echo "== bf16 b1: $(rep $M 1 X=1) / COMBINE_EARLY=0 $(rep $M 1 MLASERVE_COMBINE_EARLY=0) $(el)" >> $L
MLASERVE_OPS=moe timeout 60 $B/ops --test-threads=1 --nocapture > $OUT/ops-moe.txt 2>&1
echo "== ops moe rc=$? $(el)" >> $L; grep -E "rows|test result|FAIL" $OUT/ops-moe.txt | tail -3 >> $L
echo "end $(el)" >> $L
cat $L
