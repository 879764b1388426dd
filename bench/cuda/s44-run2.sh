#!/usr/bin/env bash
# Session 44's run 2 (13:00 UTC, run 1's warm H100; given inline, recorded here): the bf16 b1
# step against MLASERVE_LM_HEAD_GEMV=1 and the Q4_K b1 step (whose lm_head is quantized: the
# knob's control), three rounds interleaved; both profiles.
set -u
RUN=run2; . tools/device/prelude.sh; M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
timeout 100 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
rep() { m=$1; shift; timeout 90 env "$@" $B/decode_profile $m --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2 3; do
  echo "== bf16 b1 round $r: $(rep $M X=1) $(el)" >> $L
  echo "== bf16 b1 round $r LM_HEAD_GEMV=1: $(rep $M MLASERVE_LM_HEAD_GEMV=1) $(el)" >> $L
  echo "== q4k b1 round $r: $(rep $Q X=1) $(el)" >> $L
  echo "== q4k b1 round $r LM_HEAD_GEMV=1: $(rep $Q MLASERVE_LM_HEAD_GEMV=1) $(el)" >> $L
done
timeout 60 $B/decode_profile $M --batch 1 --ctx 512 > $OUT/prof-bf16.txt 2>&1
MLASERVE_LM_HEAD_GEMV=1 timeout 60 $B/decode_profile $M --batch 1 --ctx 512 > $OUT/prof-bf16-lmg.txt 2>&1
echo "end $(el)" >> $L; cat $L; grep -E "gemm|gemv" $OUT/prof-bf16*.txt
