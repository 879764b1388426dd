#!/usr/bin/env bash
# Prepared in session 46 for the next device call, NOT RUN (the session's device time went to
# refused starts). kv_a inside the quantized q_proj's norm launch (qmv_norm's second matrix;
# the lab knob `MLASERVE_QMV_NORM_KV=1`, off by default until measured). Pack: `LABS=0
# SERVER=0 tools/device/pack.sh`, `cp bench/cuda/s46-next.sh .device/next.sh`; carry
# [".device"], `bash .device/next.sh` (~150 s on an H100 after the machine starts).
# 1. The quantized op family (the new qmv_norm rows: a second matrix of 37 rows on every
#    twin and as the executor calls it, bit for bit qgemm of hnb); e2e with the knob.
# 2. The Q4_K and Q8_0 V2-Lite b1 steps, the default against MLASERVE_QMV_NORM_KV=1, rounds
#    interleaved. Predicted: one hand-off fewer a layer, ~2-4 µs, 50-110 µs a step.
set -u
RUN=s46-next; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf; Q8=/tmp/v2-q8.gguf
(timeout 100 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; timeout 100 $B/synth_model v2-lite $Q8 --type q8_0 > /dev/null 2>&1; echo "== synth $(el)" >> $L) &
MLASERVE_OPS=quantized timeout 250 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops quantized rc=$? $(el)" >> $L
grep -E "qmv_norm .*\+ \[37|FAIL|rows|test result" $OUT/ops.txt | tail -30 >> $L
MLASERVE_QMV_NORM_KV=1 timeout 150 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "== e2e NORM_KV=1 rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/e2e.txt >> $L
wait
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r NORM_KV=1: $(rep $Q 1 MLASERVE_QMV_NORM_KV=1) $(el)" >> $L
  echo "== q8 b1 round $r: $(rep $Q8 1 X=1) $(el)" >> $L
  echo "== q8 b1 round $r NORM_KV=1: $(rep $Q8 1 MLASERVE_QMV_NORM_KV=1) $(el)" >> $L
done
# 3. Session 45's pairs-on-three-CTAs knob where no slices run (two tokens)
echo "== q4k b2: $(rep $Q 2 X=1) $(el)" >> $L
echo "== q4k b2 PAIRS_W3=glu: $(rep $Q 2 MLASERVE_QMV_PAIRS_W3=glu) $(el)" >> $L
echo "end $(el)" >> $L
cat $L
