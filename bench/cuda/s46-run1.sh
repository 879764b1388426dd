#!/usr/bin/env bash
# Session 46, the first device call. Pack: `LABS=0 SERVER=0 tools/device/pack.sh`, then
# `cp bench/cuda/s46-run1.sh .device/next.sh`; carry [".device"], `bash .device/next.sh`
# (~250 s on an H100, ~350 on an H200; the kernels' first compile ~90 s of it).
# 1. The quantized and moe op families: new since the last GPU run, the expert GEMV over pairs
#    on each kernel it takes (PAIRS, WIDE3; plain and SwiGLU) and the gate|up over pairs with
#    shared-expert slices (MLASERVE_QMV_SLICES; Q8_0 and Q4_K), bit for bit qmv_glu; e2e with
#    the slices on and with the pairs on three CTAs (MLASERVE_QMV_PAIRS_W3=1): the same figures.
# 2. The Q4_K V2-Lite b1 step, two rounds interleaved: the default, MLASERVE_QMV_SLICES=1
#    (the shared experts' gate|up inside the routed pairs' launch: one launch fewer a layer),
#    and MLASERVE_QMV_PAIRS_W3=glu (slices keep the two-CTA kernel); b2 once each (slices are
#    one-token only: a control).
# 3. On an H200 (item 2's card): the bf16 b1 step, and the Q4_K b1 with MLASERVE_QMV_NORM=0.
set -u
RUN=s46-run1; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
h200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
(timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L) &
MLASERVE_OPS=quantized,moe timeout 250 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops quantized,moe rc=$? $(el)" >> $L
grep -E "slices|w3|FAIL|rows|test result" $OUT/ops.txt | tail -30 >> $L
wait
for knob in X=1 MLASERVE_QMV_SLICES=1 MLASERVE_QMV_PAIRS_W3=1; do
  env $knob timeout 150 $B/e2e --test-threads=2 --nocapture > $OUT/e2e-$knob.txt 2>&1
  echo "== e2e $knob rc=$? $(el)" >> $L
  grep -E "test result|FAIL|panicked" $OUT/e2e-$knob.txt >> $L
done
# the figures the e2e tests print, default against each knob
for knob in MLASERVE_QMV_SLICES=1 MLASERVE_QMV_PAIRS_W3=1; do
  echo "== e2e figures differ ($knob): $(diff <(grep -vE 'finished in|^test |Running' $OUT/e2e-X=1.txt | sort) <(grep -vE 'finished in|^test |Running' $OUT/e2e-$knob.txt | sort) | wc -l) lines" >> $L
done
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r SLICES=1: $(rep $Q 1 MLASERVE_QMV_SLICES=1) $(el)" >> $L
  echo "== q4k b1 round $r PAIRS_W3=glu: $(rep $Q 1 MLASERVE_QMV_PAIRS_W3=glu) $(el)" >> $L
done
echo "== q4k b2: $(rep $Q 2 X=1) $(el)" >> $L
echo "== q4k b2 SLICES=1: $(rep $Q 2 MLASERVE_QMV_SLICES=1) $(el)" >> $L
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
