#!/usr/bin/env bash
# Session 31, run 5: the radix selects' bins as two 32-bit words (run 4's lab: the 64-bit
# shared atomics compiled to compare-and-swap spins, ~0.5 ms a select at one row). The pick
# family (bit for bit RowPick::of), graphs, the logits_pick lab, tg128 sampled / filtered.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run5.txt
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
  timeout 100 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64,256 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /|rror" >> $L
done
echo "end $(el)" >> $L
cat $L
