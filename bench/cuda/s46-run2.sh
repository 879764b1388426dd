#!/usr/bin/env bash
# Session 46, run 2 (right after run 1, same build): the Q8_0 V2-Lite b1 step with and without
# MLASERVE_QMV_SLICES=1 (two rounds), and the Q4_K step's gate|up marginal with slices.
set -u
RUN=s46-run2; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf; Q8=/tmp/v2-q8.gguf
[ -e $Q ] || timeout 100 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1
timeout 100 $B/synth_model v2-lite $Q8 --type q8_0 > /dev/null 2>&1; echo "== synth q8 $(el)" >> $L
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q8 b1 round $r: $(rep $Q8 1 X=1) $(el)" >> $L
  echo "== q8 b1 round $r SLICES=1: $(rep $Q8 1 MLASERVE_QMV_SLICES=1) $(el)" >> $L
done
echo "== q4k b1 SLICES=1: $(rep $Q 1 MLASERVE_QMV_SLICES=1) $(el)" >> $L
for k in qmv_q4_k_r2m1w_glu qmv_q4_k_r2m1w_comb qmv_q8_0_r2m1w; do
  echo "== q4k b1 SLICES=1 twice $k: $(rep $Q 1 MLASERVE_QMV_SLICES=1 MLASERVE_LAB_TWICE=$k) $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
