#!/usr/bin/env bash
# Session 45, run 3 (the same warm H100 as run 2, af58592's build): each kernel's marginal
# cost in the Q4_K V2-Lite b1 step with the attention norm inside q_proj's GEMV
# (MLASERVE_LAB_TWICE=k launches each of k's launches twice; the step's growth over plain).
RUN=run3; . tools/device/prelude.sh; Q=/tmp/v2-q4k.gguf
timeout 100 $B/synth_model v2-lite $Q --type q4_k >/dev/null 2>&1
rep() { t=$1; shift; timeout $t env "$@" $B/decode_profile $Q --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
echo "== plain (compiles): $(rep 200 X=1) $(el)" >> $L
for k in qmv_q4_k_r2m1w_norm qmv_q4_k_r2m1w mla_attn_cl qmv_q4_k_r2m1w_glu qmv_q8_0_r2m1w \
    moe_norm_route_cl qmv_q4_k_r2m1w3_glu qmv_q4_k_r2m1w_comb; do
  echo "== twice $k: $(rep 60 MLASERVE_LAB_TWICE=$k) $(el)" >> $L
done
echo "== plain: $(rep 60 X=1) $(el)" >> $L
cat $L
