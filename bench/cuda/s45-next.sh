#!/usr/bin/env bash
# Prepared in session 45 for the next device call, NOT RUN (no device time left).
# Pack: main's build by tools/device/pack.sh's recipe, `LABS=0 SERVER=0 tools/device/pack.sh`
# (add `.device/` to .git/info/exclude first; the tracked tree leaves ~3 MiB of the carry),
# then `cp bench/cuda/s45-next.sh .device/next.sh`; carry [".device"], `bash .device/next.sh`
# (~200 s on an H100, ~300 on an H200; the kernels' first compile ~90 s of it).
# 1. Never run on a GPU: the quantized family's new rows — the expert GEMV over pairs on
#    each kernel it can take (PAIRS, WIDE3; plain and SwiGLU) bit for bit qmv_pairs; the moe
#    family as landed; e2e with MLASERVE_QMV_PAIRS_W3=1 (the quantized fixtures' pairs).
# 2. The Q4_K V2-Lite b1 step: MLASERVE_QMV_PAIRS_W3=glu (the routed gate|up on three CTAs an
#    SM: 66 CTAs a pair, 2-3 row groups a warp, one K step in flight) and =1 (the routed down
#    too) against the default, two rounds interleaved; b2 once each. Predicted: no better than
#    ±1 µs a layer — the two-CTA kernel keeps more bytes in flight an SM (32 steps against 24);
#    it decides whether the gate|up's 74% of the read ceiling is the walk's rounds or its loads.
# 3. On an H200 (item 2's card; nothing since session 40's 1,802 µs): the bf16 b1 step, and
#    the Q4_K b1 step with and without the fused attention norm (MLASERVE_QMV_NORM=0).
set -u
RUN=next; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
h200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
(timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L) &
MLASERVE_OPS=quantized,moe timeout 250 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops quantized,moe rc=$? $(el)" >> $L
grep -E "qmv_pairs|rows|test result|FAIL" $OUT/ops.txt | grep -E "w3|FAIL|rows|result" | tail -30 >> $L
wait
MLASERVE_QMV_PAIRS_W3=1 timeout 150 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1
echo "== e2e PAIRS_W3=1 rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/tests.txt >> $L
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r PAIRS_W3=glu: $(rep $Q 1 MLASERVE_QMV_PAIRS_W3=glu) $(el)" >> $L
  echo "== q4k b1 round $r PAIRS_W3=1: $(rep $Q 1 MLASERVE_QMV_PAIRS_W3=1) $(el)" >> $L
done
echo "== q4k b2: $(rep $Q 2 X=1) $(el)" >> $L
echo "== q4k b2 PAIRS_W3=1: $(rep $Q 2 MLASERVE_QMV_PAIRS_W3=1) $(el)" >> $L
if [ $h200 = 1 ]; then
  echo "== q4k b1 QMV_NORM=0: $(rep $Q 1 MLASERVE_QMV_NORM=0) $(el)" >> $L
  rm -f $Q
  timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
  for r in 1 2; do
    echo "== bf16 b1 round $r: $(rep $M 1 X=1) $(el)" >> $L
    echo "== bf16 b1 round $r LM_HEAD_GEMV=0: $(rep $M 1 MLASERVE_LM_HEAD_GEMV=0) $(el)" >> $L
  done
fi
echo "end $(el)" >> $L
cat $L
