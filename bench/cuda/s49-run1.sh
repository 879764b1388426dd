#!/usr/bin/env bash
# Session 49, run 1 = session 48's prepared run 1 (never ran) and, on an H200, item 2's bf16
# b1 figure (last: 1,802 µs in session 40; the bound 1,646). Session 48's run 1: the fused
# quantized down (`MLASERVE_QMV_DOWN1`) with each warp's later rows prefetched into L2 before its wait (flags bit 2, `MLASERVE_QMV_DOWN1_PF=0` turns it
# off). Session 47's run 2 priced quantizing act in every block at 43-57 µs a Q4_K step
# (`-DQD_LAB_NOQ`): the prefetch lets HBM stream the block's rows during that stall.
# Also the op family again: in s47-run2 it printed nothing in 120 s (the op table now prints
# when its kernels are ready and when each family starts).
# Pack: `LABS=0 SERVER=0 tools/device/pack.sh`, `cp bench/cuda/s49-run1.sh .device/next.sh`;
# carry [".device"], `bash .device/next.sh` (~170 s on an H100, ~300 on an H200 with the bf16
# block; the 8-row block, slower in s47-run2, is left out).
set -u
RUN=s49-run1; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf; Q8=/tmp/v2-q8.gguf; M=/tmp/v2-bf16.gguf
H200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
(timeout 100 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L; timeout 100 $B/synth_model v2-lite $Q8 --type q8_0 > /dev/null 2>&1; echo "== synth q8 $(el)" >> $L) &
MLASERVE_OPS=qmv_down timeout 100 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops qmv_down rc=$? $(el)" >> $L
grep -E "kernels ready|family|inputs made|qmv_down_comb|FAIL|rows|test result|does not fit" $OUT/ops.txt | tail -30 >> $L
wait
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r DOWN1=16: $(rep $Q 1 MLASERVE_QMV_DOWN1=16) $(el)" >> $L
  echo "== q4k b1 round $r DOWN1=16 PF=0: $(rep $Q 1 MLASERVE_QMV_DOWN1=16 MLASERVE_QMV_DOWN1_PF=0) $(el)" >> $L
done
for r in 1 2; do
  echo "== q8 b1 round $r: $(rep $Q8 1 X=1) $(el)" >> $L
  echo "== q8 b1 round $r DOWN1=16: $(rep $Q8 1 MLASERVE_QMV_DOWN1=16) $(el)" >> $L
done
rm -f $Q8  # (the disk is 64 GB: the bf16 model is 31)
[ $H200 = 1 ] && (timeout 250 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth bf16 $(el)" >> $L) &
T=MLASERVE_LAB_TWICE
echo "== q4k b1 DOWN1=16 twice: $(rep $Q 1 MLASERVE_QMV_DOWN1=16 $T=qmv_down_comb_q8_0_q4_k_r16) $(el)" >> $L
MLASERVE_QMV_DOWN1=16 timeout 100 $B/e2e --test-threads=2 > $OUT/e2e-16.txt 2>&1; echo "== e2e DOWN1=16 rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/e2e-16.txt >> $L
wait
if [ $H200 = 1 ]; then
  for r in 1 2; do
    echo "== bf16 b1 round $r: $(rep $M 1 X=1) $(el)" >> $L
  done
fi
echo "end $(el)" >> $L
cat $L
