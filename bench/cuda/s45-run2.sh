#!/usr/bin/env bash
# Session 45, run 2: item 2's figure on an H200 (none since session 40's 1,802 µs) with the
# quantized attention norm on by default (this session's flip), one round each, interleaved.
# On any other card it stops after the card's line (the H100's figures are run 1's).
# Pack: LABS=0 SERVER=0 tools/device/pack.sh; cp bench/cuda/s45-run2.sh .device/next.sh;
# carry [".device"], `bash .device/next.sh` (~220 s: the bf16 synth, the kernels' compile).
set -u
RUN=run2; . tools/device/prelude.sh
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200" >> $L; cat $L; exit 0; }
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L
(timeout 250 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth bf16 $(el)" >> $L) &
rep() { m=$1; b=$2; t=$3; shift 3; timeout $t env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
echo "== q4k b1 (compiles): $(rep $Q 1 200 X=1) $(el)" >> $L
echo "== q4k b1 QMV_NORM=0: $(rep $Q 1 90 MLASERVE_QMV_NORM=0) $(el)" >> $L
echo "== q4k b1: $(rep $Q 1 90 X=1) $(el)" >> $L
wait; rm -f $Q
for r in 1 2; do
  echo "== bf16 b1 round $r: $(rep $M 1 90 X=1) $(el)" >> $L
  echo "== bf16 b1 round $r LM_HEAD_GEMV=0: $(rep $M 1 90 MLASERVE_LM_HEAD_GEMV=0) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
