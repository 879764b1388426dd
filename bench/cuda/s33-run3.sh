#!/usr/bin/env bash
# Session 33, run 3: logits_pick split over a cluster of blocks a row at few rows (pick.cu).
# The pick family at clusters of 1, 2 and 8 (bit for bit RowPick::of), graphs, the lab and
# tg128 sampled / filtered with MLASERVE_PICK_CLUSTER=1 (a block a row, as before) against
# the default (8 blocks a row at 1-16 rows, 4 at 17-33, 2 at 34-66), same binary.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run3.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OPS=argmax timeout 240 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "logits_pick" $OUT/tests.txt | awk '{print $NF, $(NF-2)}' | sort | uniq -c >> $L
grep -E "logits_pick" $OUT/tests.txt | grep -v "err 0.000e0" | head -20 >> $L
grep -E "test result|past their bound|panicked" $OUT/tests.txt | head >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "picked on the device|test result|FAILED|panicked" $OUT/tests.txt | tail -4 >> $L
for c in 1 auto; do
  echo "== lab, MLASERVE_PICK_CLUSTER=$c $(el)" >> $L
  ( [ $c = auto ] || export MLASERVE_PICK_CLUSTER=$c; timeout 100 $B/logits_pick >> $L 2>&1 )
done
wait
for r in 1 2; do for c in 1 auto; do for m in sample sample-filtered; do
  echo "== round $r, MLASERVE_PICK_CLUSTER=$c, $m $(el)" >> $L
  ( [ $c = auto ] || export MLASERVE_PICK_CLUSTER=$c
    timeout 100 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,16,64 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /|rror" >> $L )
done; done; done
echo "end $(el)" >> $L
cat $L
