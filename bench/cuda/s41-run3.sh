#!/usr/bin/env bash
# Session 41's run 3: the landed build (1ed4af7, the combine's first weights before its wait)
# against b117da5's (decode_profile_old), b1 at context 512, two rounds — for item 2's figure
# on whatever card is lent (runs 1-2 were lent H100s). The same pack as s41-run2.sh.
set -u
RUN=${RUN:-run3}; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2; timeout 250 $B/decode_profile_old $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 $1 $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r old (b117da5): $(rep $B/decode_profile_old) $(el)" >> $L
  echo "== b1 round $r new: $(rep $B/decode_profile) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
