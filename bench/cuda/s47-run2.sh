#!/usr/bin/env bash
# Session 47, run 2: the fused quantized down (`MLASERVE_QMV_DOWN1`) rebuilt after run 1 (one
# loop over both block types spilled 40 bytes and its Q4_K step was 67 µs slower): warps split
# by type (no spill), and a 16-row block of 16 warps (`=16`: act quantized half as many
# times); and kv_a in the norm launch, now the default, against `MLASERVE_QMV_NORM_KV=0`.
# On an H200 also item 2's bf16 b1 figure (none since session 40).
# Pack: `LABS=0 SERVER=0 tools/device/pack.sh`, `cp bench/cuda/s47-run2.sh .device/next.sh`;
# carry [".device"], `bash .device/next.sh` (~220 s on an H100, ~350 s on an H200; the
# last two lines compile the kernels once more with -DQD_LAB_NOQ).
set -u
RUN=s47-run2; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf; Q8=/tmp/v2-q8.gguf; M=/tmp/v2-bf16t.gguf
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
(timeout 100 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; timeout 100 $B/synth_model v2-lite $Q8 --type q8_0 > /dev/null 2>&1; echo "== synth $(el)" >> $L
 [ $H200 = 1 ] && { timeout 250 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth bf16 $(el)" >> $L; }) &
MLASERVE_OPS=qmv_down timeout 120 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops qmv_down rc=$? $(el)" >> $L
grep -E "qmv_down_comb|FAIL|rows|test result|does not fit" $OUT/ops.txt | tail -24 >> $L
for d in 0 1 16; do
  MLASERVE_QMV_DOWN1=$d timeout 100 $B/e2e --test-threads=2 > $OUT/e2e-$d.txt 2>&1; echo "== e2e DOWN1=$d rc=$? $(el)" >> $L
  grep -E "test result|FAIL|panicked" $OUT/e2e-$d.txt >> $L
done
wait
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r NORM_KV=0: $(rep $Q 1 MLASERVE_QMV_NORM_KV=0) $(el)" >> $L
  echo "== q4k b1 round $r DOWN1=1: $(rep $Q 1 MLASERVE_QMV_DOWN1=1) $(el)" >> $L
  echo "== q4k b1 round $r DOWN1=16: $(rep $Q 1 MLASERVE_QMV_DOWN1=16) $(el)" >> $L
  echo "== q8 b1 round $r: $(rep $Q8 1 X=1) $(el)" >> $L
  echo "== q8 b1 round $r DOWN1=1: $(rep $Q8 1 MLASERVE_QMV_DOWN1=1) $(el)" >> $L
  echo "== q8 b1 round $r DOWN1=16: $(rep $Q8 1 MLASERVE_QMV_DOWN1=16) $(el)" >> $L
done
if [ $H200 = 1 ] && [ -s $M ]; then
  for r in 1 2; do echo "== bf16 b1 round $r: $(rep $M 1 X=1) $(el)" >> $L; done
fi
T=MLASERVE_LAB_TWICE
echo "== q4k b1 DOWN1=1 twice: $(rep $Q 1 MLASERVE_QMV_DOWN1=1 $T=qmv_down_comb_q8_0_q4_k) $(el)" >> $L
echo "== q4k b1 DOWN1=16 twice: $(rep $Q 1 MLASERVE_QMV_DOWN1=16 $T=qmv_down_comb_q8_0_q4_k_r16) $(el)" >> $L
echo "== q4k b1 twice qmv_q8_0_r2m1w: $(rep $Q 1 $T=qmv_q8_0_r2m1w) $(el)" >> $L
echo "== q4k b1 twice qmv_q4_k_r2m1w_comb: $(rep $Q 1 $T=qmv_q4_k_r2m1w_comb) $(el)" >> $L
# what quantizing act in every block costs the fused down (a timing lab: wrong sums)
rq() { timeout 150 env "$@" $B/decode_profile $Q --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
echo "== q4k b1 DOWN1=1 QD_LAB_NOQ: $(rq MLASERVE_QMV_DOWN1=1 MLASERVE_KERNEL_DEFINES=-DQD_LAB_NOQ) $(el)" >> $L
echo "== q4k b1 DOWN1=16 QD_LAB_NOQ: $(rq MLASERVE_QMV_DOWN1=16 MLASERVE_KERNEL_DEFINES=-DQD_LAB_NOQ) $(el)" >> $L
echo "end $(el)" >> $L
cat $L
