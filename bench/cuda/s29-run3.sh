#!/usr/bin/env bash
# Session 29, run 3: logits_pick's draw with coalesced loads (warp segments of float4 steps;
# run 2's kernel gave each thread a contiguous chunk: 32 lines a warp load). The pick family
# (now with 154,880- and 40,001-token rows), graphs; tg128 b1 argmax / sampled, interleaved.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run3.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OPS=argmax timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "logits_pick|test result|past their bound" $OUT/tests.txt | head -30 >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "picked on the device|test result|FAILED|panicked" $OUT/tests.txt >> $L
wait
for r in 1 2; do
  for m in argmax sample; do
    timeout 100 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /" >> $L
  done
done
echo "end $(el)" >> $L
cat $L
