#!/usr/bin/env bash
# Session 37, run 3: where mla_attn_cl's ~4 µs before its PDL wait go (runs 1-2: the attention's
# blocks start only once the q|kv_a GEMV has left, so all of it is on the step's path).
# `attn-pretrace-s37.patch` (the landed cubin unchanged without the define: md5 compared)
# adds MAC_LAB_PRE_TRACE: the phase trace's points (MLASERVE_KERNEL_TRACE=1) moved into the
# pre-wait work, each after the value it names has arrived — 1 the weights' loads issued,
# 2 the step inputs (n_keys, sel_off, bt_off, slots), 3 the first chunk's slots (block table),
# 4 its copies issued, 5 the second pass (has_new), 6 the norm weight and cos/sin, 7 after the
# PDL wait, 8 the weights arrived; the points after them are off (zeros).
# Build machine: git apply bench/cuda/attn-pretrace-s37.patch; the usual builds;
#   LABS=0 tools/device/pack.sh; cp this .device/next.sh.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run3.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
export MLASERVE_KERNEL_TRACE=1
MLASERVE_KERNEL_DEFINES="-DMAC_LAB_PRE_TRACE" timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 4
timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
for r in 1 2; do
  echo "== round $r pre-wait points" >> $L
  MLASERVE_KERNEL_DEFINES="-DMAC_LAB_PRE_TRACE" timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 >> $L 2>&1
  echo "== round $r landed points" >> $L
  timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 >> $L 2>&1
done
echo "end $(el)" >> $L
cat $L
