#!/usr/bin/env bash
# Session 28, run 1: greedy steps reduced to argmaxes on the device (forward_argmax, the
# logits_argmax kernel) — its op-table family, the graphs test (device argmax against the
# logits rows, graphed and eager), e2e; then the whole step with the logits copied against
# reduced on the device (decode_profile --forward at 1, 64 and 256 rows) and mlaserve bench
# tg with --tg-logits full / argmax in one process pair each.
# On the build machine: cargo build ... && LABS=0 tools/device/pack.sh;
# pip download httpx==0.28.1 -d .device/wheels --only-binary=:all:; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
(timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth done $(el)" >> $L) &
MLASERVE_OPS=argmax timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops argmax rc=$? $(el)" >> $L
grep -E "logits_argmax|test result|FAIL" $OUT/tests.txt >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "reduced on the device|test result|panicked" $OUT/tests.txt | tail -4 >> $L
timeout 110 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
wait
for b in 1 64 256; do
  echo "== decode_profile b$b ctx 64 $(el)" >> $L
  timeout 90 $B/decode_profile /tmp/v2-bf16t.gguf --batch $b --ctx 64 --forward 40 --replays 50 2>&1 | grep -E "median|MB of|rror" >> $L
done
for t in full argmax full argmax; do
  echo "== bench tg-logits $t $(el)" >> $L
  timeout 80 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64,256 -r 3 --tg-logits $t 2>&1 | grep -E "^\|" | tail -3 >> $L
done
echo "end $(el)" >> $L
cat $L
