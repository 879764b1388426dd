#!/usr/bin/env bash
# Session 44's first device call: s43-next.sh (item 2's H200 figure and the step's marginals;
# on an H100 the Q4_K b1 step's marginals) plus one A/B: the lm_head (102,400 x 2,048 bf16,
# one launch a step) on the in-house one-row GEMV (`MLASERVE_LM_HEAD_GEMV=1`) against cuBLAS.
# read_bw timed that GEMV at 3,101-3,107 GB/s on an H100 (the read ceiling) where cuBLAS in the
# step took ~150 µs (~2,800 GB/s); on the H200 cuBLAS took 101.5 µs (4,135 GB/s, session 11).
# Predicted: H100 −10 to −15 µs a step, H200 −3 to −8. And a lab build of the one-row GEMV
# (`MLASERVE_KERNEL_DEFINES=-DGEMV_LOOP=8`: its loop past the preloaded K steps requests 8
# steps of both rows at a time, not 4; gemv_bf16_m1 stays at 123 registers, 2 blocks an SM):
# only layer 0's down [2,048 x 10,944] takes that loop at one vector (128 blocks, one an SM:
# 71% of the read ceiling on an H100, 20.5 µs); predicted −4 to −6 µs a step.
# Pack: this session's build (main + the knob): decode_profile, synth_model, read_bw, ops, e2e,
# graphs in .device/pkg/bins.tar.xz; run `bash .device/run1.sh`, carry [".device"].
set -u
RUN=run1; . tools/device/prelude.sh
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
    echo "== bf16 b1 round $r LM_HEAD_GEMV=1: $(rep $M MLASERVE_LM_HEAD_GEMV=1) $(el)" >> $L
    echo "== bf16 b1 round $r GEMV_LOOP=8: $(rep $M MLASERVE_KERNEL_DEFINES=-DGEMV_LOOP=8) $(el)" >> $L
    echo "== q4k b1 round $r: $(rep $Q X=1) $(el)" >> $L
    echo "== q4k b1 round $r PAIRS_EARLY=0: $(rep $Q MLASERVE_QMV_PAIRS_EARLY=0) $(el)" >> $L
  done
else
  timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
  for r in 1 2; do
    echo "== bf16 b1 round $r: $(rep $M X=1) $(el)" >> $L
    echo "== bf16 b1 round $r LM_HEAD_GEMV=1: $(rep $M MLASERVE_LM_HEAD_GEMV=1) $(el)" >> $L
    echo "== bf16 b1 round $r GEMV_LOOP=8: $(rep $M MLASERVE_KERNEL_DEFINES=-DGEMV_LOOP=8) $(el)" >> $L
  done
  rm -f $M
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
echo "== read_bw GEMV_LOOP=8" >> $L
MLASERVE_KERNEL_DEFINES=-DGEMV_LOOP=8 timeout 100 $B/read_bw 2>&1 | grep -E "gemv_bf16" >> $L
echo "end $(el)" >> $L
cat $L; head -40 $OUT/profile-b1.txt
