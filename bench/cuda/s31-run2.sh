#!/usr/bin/env bash
# Session 31, run 2: the filtered draw's cuts by radix select (three 10-bit digit passes, a
# shared histogram each) instead of 30-step bisections. The pick family (bit for bit
# RowPick::of), graphs; tg128 b1/b64/b256 sampled and sampled with top-k 50 + top-p 0.95,
# interleaved twice (run 1's bisections: 334.7 / 4,899.7 / 10,998.4 tok/s filtered).
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
wait
for r in 1 2; do
  for m in sample sample-filtered; do
    timeout 120 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64,256 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /|rror" >> $L
  done
done
echo "end $(el)" >> $L
cat $L
