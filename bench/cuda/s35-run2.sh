#!/usr/bin/env bash
# Session 35, run 2: why run 1's column split was slower (b1 2,312 µs against 2,278 old, and
# the refactored key split alone 2,291). Lab build (MCC_KEYS and the allocation as knobs):
#   - b1 replays, two rounds interleaved: old (f77305b); new (640 keys, 108,336 B); the column
#     split at 576 keys in the old allocation (-DMCC_KEYS=576, MLASERVE_ATTN_SMEM=101392); the
#     key split alone in the old allocation (-DMCC_KEYS=576 -DMAC_LAB_KEYS_ONLY, 101,392 B);
#   - the phase trace (MLASERVE_KERNEL_TRACE=1) of old and new: clocks per phase, blocks a SM.
# Build machine: decode_profile (this lab tree), decode_profile_old (f77305b), synth_model
#   in .device/pkg/bins.tar.xz; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
# Every kernel build compiled at once (each process its own cache entry).
w() { timeout 200 "$@" $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1; }
w $B/decode_profile_old & w $B/decode_profile &
MLASERVE_KERNEL_DEFINES="-DMCC_KEYS=576" MLASERVE_ATTN_SMEM=101392 w $B/decode_profile &
MLASERVE_KERNEL_DEFINES="-DMCC_KEYS=576 -DMAC_LAB_KEYS_ONLY" MLASERVE_ATTN_SMEM=101392 w $B/decode_profile &
MLASERVE_KERNEL_TRACE=1 w $B/decode_profile_old & MLASERVE_KERNEL_TRACE=1 w $B/decode_profile &
wait; echo "== compiled $(el)" >> $L
rep() { timeout 90 "$@" $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r old: $(rep $B/decode_profile_old) $(el)" >> $L
  echo "== b1 round $r new640: $(rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r cols576@101392: $(MLASERVE_KERNEL_DEFINES="-DMCC_KEYS=576" MLASERVE_ATTN_SMEM=101392 rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r keys576@101392: $(MLASERVE_KERNEL_DEFINES="-DMCC_KEYS=576 -DMAC_LAB_KEYS_ONLY" MLASERVE_ATTN_SMEM=101392 rep $B/decode_profile) $(el)" >> $L
done
for p in decode_profile_old decode_profile; do
  echo "== trace $p" >> $L
  MLASERVE_KERNEL_TRACE=1 timeout 90 $B/$p $M --batch 1 --ctx 512 --replays 50 2>&1 | grep -A20 "trace of" >> $L
done
echo "end $(el)" >> $L
cat $L
