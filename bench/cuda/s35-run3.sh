#!/usr/bin/env bash
# Session 35, run 3: mla_attn_cl's pre-wait chain. Run 2's trace: the PDL wait returns at
# once (10 clocks, median block) after 8,636 clocks of pre-wait work, so that work's tail is
# on the step's critical path. Its chain: the step inputs (n_keys, sel_off, bt_off, slots),
# then the block table, then the copies — issued behind 32 KB a block of weight loads — and
# a second pass over the block table for `mine`. Variants (lab defines, f77305b's kernel
# otherwise):
#   MAC_LAB_MINE        `mine` from the first chunk's slot pass (no second pass, one barrier
#                       fewer in mac_load_chunk);
#   MAC_LAB_CTRL_FIRST  the step inputs loaded before the weights;
#   MAC_LAB_W_LATE      the weights loaded after the copies are issued (still before the wait).
# The op table's attn_cluster family under each variant, then b1 replays, two rounds
# interleaved, with decode_profile_old (f77305b) and the default build (the same code,
# reordered declarations: another SASS).
# Build machine: decode_profile and ops of this lab tree, decode_profile_old (f77305b),
#   synth_model in .device/pkg/bins.tar.xz; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run3.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
( timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
V=("" "-DMAC_LAB_MINE" "-DMAC_LAB_CTRL_FIRST" "-DMAC_LAB_CTRL_FIRST -DMAC_LAB_MINE" "-DMAC_LAB_W_LATE -DMAC_LAB_MINE")
for i in "${!V[@]}"; do
  ( MLASERVE_OPS=attn_cluster MLASERVE_KERNEL_DEFINES="${V[$i]}" timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/ops$i.txt 2>&1; echo "ops [${V[$i]}] rc=$? $(el)" >> $L ) &
done
wait
( timeout 200 $B/decode_profile_old $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1; echo "== old compiled $(el)" >> $L )
for i in "${!V[@]}"; do grep -E "mla_attn_cl " $OUT/ops$i.txt | awk '{print $NF, $(NF-2)}' | tr '\n' ' ' | sed "s/^/ops$i err,bound: /" >> $L; echo >> $L; done
rep() { timeout 90 "$@" $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r old: $(rep $B/decode_profile_old) $(el)" >> $L
  for d in "${V[@]}"; do
    echo "== b1 round $r [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep $B/decode_profile) $(el)" >> $L
  done
done
echo "end $(el)" >> $L
cat $L
