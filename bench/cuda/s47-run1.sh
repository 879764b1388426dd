#!/usr/bin/env bash
# Session 47, run 1: two lab knobs never run on a GPU, and on an H200 item 2's bf16 b1 figure
# (none since session 40's 1,802 µs).
# - `MLASERVE_QMV_NORM_KV=1` (session 46): kv_a inside the quantized q_proj's norm launch.
# - `MLASERVE_QMV_DOWN1=1` (this session): one token's routed downs, their combine and the
#   shared down in one launch (qmv_down.rs), the quantized layer's 8 launches -> 7 (6 with both).
# 1. The `quantized` and `qmv_down` op families (the new rows: bit for bit the chains they
#    replace); e2e with both knobs.
# 2. The Q4_K and Q8_0 V2-Lite b1 steps: default, each knob, both; rounds interleaved.
#    Predicted: one hand-off fewer a layer each, 2.9-4.7 µs (sessions 45-46), 50-110 µs a step.
# Pack: `LABS=0 SERVER=0 tools/device/pack.sh`, `cp bench/cuda/s47-run1.sh .device/next.sh`;
# carry [".device"], `bash .device/next.sh` (~250 s on an H100, ~350 s on an H200).
set -u
RUN=s47-run1; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf; Q8=/tmp/v2-q8.gguf; M=/tmp/v2-bf16t.gguf
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
(timeout 100 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; timeout 100 $B/synth_model v2-lite $Q8 --type q8_0 > /dev/null 2>&1; echo "== synth $(el)" >> $L
 [ $H200 = 1 ] && { timeout 250 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth bf16 $(el)" >> $L; }) &
MLASERVE_OPS=quantized,qmv_down timeout 250 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops quantized,qmv_down rc=$? $(el)" >> $L
grep -E "qmv_norm .*\+ \[37|qmv_down_comb|FAIL|rows|test result|does not fit" $OUT/ops.txt | tail -40 >> $L
MLASERVE_QMV_NORM_KV=1 MLASERVE_QMV_DOWN1=1 timeout 150 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "== e2e NORM_KV=1 DOWN1=1 rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/e2e.txt >> $L
wait
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for m in $Q $Q8; do
    echo "== $(basename $m) b1 round $r: $(rep $m 1 X=1) $(el)" >> $L
    echo "== $(basename $m) b1 round $r NORM_KV=1: $(rep $m 1 MLASERVE_QMV_NORM_KV=1) $(el)" >> $L
    echo "== $(basename $m) b1 round $r DOWN1=1: $(rep $m 1 MLASERVE_QMV_DOWN1=1) $(el)" >> $L
    echo "== $(basename $m) b1 round $r both: $(rep $m 1 MLASERVE_QMV_NORM_KV=1 MLASERVE_QMV_DOWN1=1) $(el)" >> $L
  done
done
if [ $H200 = 1 ] && [ -s $M ]; then
  for r in 1 2; do echo "== bf16 b1 round $r: $(rep $M 1 X=1) $(el)" >> $L; done
fi
echo "== q4k b1 DOWN1=1 twice qmv_down_comb_q8_0_q4_k: $(rep $Q 1 MLASERVE_QMV_DOWN1=1 MLASERVE_LAB_TWICE=qmv_down_comb_q8_0_q4_k) $(el)" >> $L
echo "end $(el)" >> $L
cat $L
