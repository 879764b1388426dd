#!/usr/bin/env bash
# Prepared for session 43's second device call, NOT RUN (its five calls after run 2 were refused).
# Pack: main's build by s42-first.sh's recipe (the patch has landed: nothing to apply), with
# read_bw — packed from 014d832 at the end of session 43 into .device/pkg, with this script as
# .device/next.sh: run `bash .device/next.sh`, carry [".device"] (~270 s on an H200).
# On an H200 (item 2's card): the bf16 b1 step (landed: early combine) against
# MLASERVE_COMBINE_EARLY=0, and the Q4_K b1 step against MLASERVE_QMV_PAIRS_EARLY=0, two rounds
# each; then s42-run2.sh's breakdown of the bf16 b1 step (profile, the nine largest kernels'
# marginal costs, read_bw) — never measured on an H200 since the early loads landed.
# On an H100 (the first call's card): the same breakdown of the Q4_K b1 step (item 5 in the
# step: what each quantized kernel costs where it runs), nothing else.
set -u
RUN=next; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
rep() { m=$1; shift; timeout 90 env "$@" $B/decode_profile $m --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  (timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L) &
  timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
  wait
  timeout 250 $B/decode_profile $M --batch 1 --ctx 512 > $OUT/profile-b1.txt 2>&1; echo "== compiled, profile rc=$? $(el)" >> $L
  for r in 1 2; do
    echo "== bf16 b1 round $r: $(rep $M X=1) $(el)" >> $L
    echo "== bf16 b1 round $r COMBINE_EARLY=0: $(rep $M MLASERVE_COMBINE_EARLY=0) $(el)" >> $L
    echo "== q4k b1 round $r: $(rep $Q X=1) $(el)" >> $L
    echo "== q4k b1 round $r PAIRS_EARLY=0: $(rep $Q MLASERVE_QMV_PAIRS_EARLY=0) $(el)" >> $L
  done
else
  M=$Q
  timeout 200 $B/synth_model v2-lite $M --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L
  timeout 250 $B/decode_profile $M --batch 1 --ctx 512 > $OUT/profile-b1.txt 2>&1; echo "== compiled, profile rc=$? $(el)" >> $L
fi
echo "== plain: $(rep $M X=1) $(el)" >> $L
for k in $(grep -E '^\| [a-z_0-9]+ \|' $OUT/profile-b1.txt | grep -vE '^\| (gemm|label) ' | awk '{print $2}' | head -7); do
  echo "== twice $k: $(rep $M MLASERVE_LAB_TWICE=$k) $(el)" >> $L
done
echo "== plain: $(rep $M X=1) $(el)" >> $L
echo "== read_bw" >> $L
timeout 100 $B/read_bw 2>&1 | grep -E "lab_read_u4 x 8|lab_copy|moe_|gemv_bf16|swiglu" >> $L
echo "end $(el)" >> $L
cat $L; head -30 $OUT/profile-b1.txt
