#!/usr/bin/env bash
# Session 41's run 4 (the warm machine of run 3, the same pack): b2 and b4 steps (the same
# SwiGLU + combine chain over 2-4 tokens' pairs) against b117da5's, two rounds; b1 with the
# 8-rows-a-block combine (MLASERVE_COMBINE_ROWS=8) now that its first weights come early.
set -u
RUN=run4; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
[ -f $M ] || timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1
rep() { b=$1; shift; timeout 90 "$@" $M --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for b in 2 4; do
    echo "== b$b round $r old (b117da5): $(rep $b $B/decode_profile_old) $(el)" >> $L
    echo "== b$b round $r new: $(rep $b $B/decode_profile) $(el)" >> $L
  done
  echo "== b1 round $r new COMBINE_ROWS=8: $(MLASERVE_COMBINE_ROWS=8 rep 1 $B/decode_profile) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
