#!/usr/bin/env bash
# Session 26, run 7: what a split product's extra launches cost inside the Q4_K V2-Lite
# model's pipelined step (after run 6's fold lost): MLASERVE_LAB_TWICE doubles each launch of
# a kernel, so the step's growth is that kernel's marginal cost — qgemm_reduce (the split
# partials' sum) and q8_quantize_mmq (x for the int8 kernel) — at 8 and 64 rows, one round (the session's last device seconds).
# On the build machine: cargo build ... && LABS=0 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/twice.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1
for r in 1; do for b in 8 64; do for t in "" qgemm_reduce q8_quantize_mmq; do
  echo "== q4k b$b twice=$t: $(el)" >> $L
  MLASERVE_LAB_TWICE=$t timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "== per-kernel profile b8: $(el)" >> $L
timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch 8 2>&1 | grep -E "qgemm_reduce|q8_quantize_mmq|qmmq_|total|step" | head -20 >> $L
echo "end $(el)" >> $L
cat $L
