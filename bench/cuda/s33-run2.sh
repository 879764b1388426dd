#!/usr/bin/env bash
# Session 33, run 2: the radix selects with an atomic a lane (run 1's lab: the warp's
# __match_any_sync aggregation cost ~4x the select). The pick family (bit for bit
# RowPick::of), graphs, the logits_pick lab, tg128 sampled / filtered. Then where a b1 decode
# step's time goes now: the profiled step (labels), its replays, and each kernel's marginal
# cost in the pipelined step (MLASERVE_LAB_TWICE: that kernel launched twice).
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OPS=argmax timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "logits_pick|test result|past their bound|error|panicked" $OUT/tests.txt | head -40 >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "picked on the device|test result|FAILED|panicked" $OUT/tests.txt >> $L
timeout 100 $B/logits_pick >> $L 2>&1; echo "lab rc=$? $(el)" >> $L
wait
for m in sample sample-filtered; do
  timeout 100 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /|rror" >> $L
done
echo "== profile $(el)" >> $L
timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch 1 --ctx 512 > $OUT/profile.txt 2>&1
grep -E "^\|" $OUT/profile.txt >> $L
labels=$(grep -E "^\| [a-z]" $OUT/profile.txt | awk -F'|' '{gsub(/ /,"",$2); print $2}' | grep -v -E "^(gemm|label)")
echo "labels: $labels" >> $L
base() { timeout 90 $B/decode_profile /tmp/v2-bf16t.gguf --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median|µs a step" | head -2; }
echo "== replays, plain: $(base) $(el)" >> $L
for k in $labels; do
  [ $(( $(date +%s) - S )) -gt 540 ] && { echo "== out of time before $k" >> $L; break; }
  echo "== twice $k: $(MLASERVE_LAB_TWICE=$k base) $(el)" >> $L
done
[ $(( $(date +%s) - S )) -lt 560 ] && echo "== replays, plain: $(base) $(el)" >> $L
echo "end $(el)" >> $L
cat $L
