#!/usr/bin/env bash
# Session 45, run 1 (15:38 UTC, an H100): s44-next.sh as it ran, its step rounds cut to two
# (q4k) and one (bf16, H200 only) to fit the device time left after nine refused calls.
# Prepared in session 44 for the next device call, NOT RUN (the session's device time ran out
# after runs 1-2). Pack: main's build by tools/device/pack.sh's recipe, packed with
# `LABS=0 EXAMPLES=read_bw tools/device/pack.sh` (add `.device/` to .git/info/exclude first),
# then `cp bench/cuda/s44-next.sh .device/next.sh`; carry [".device"], `bash .device/next.sh`
# (~250 s on an H100, ~330 on an H200, the kernels' first compile ~90 s of it).
# 1. Never run on a GPU yet: the gemms op family's GEMV over 100,003 rows (the lm_head's grid,
#    on the GEMV by default since ca3f0c0), and the quantized family's qmv_norm rows — each
#    `qmv_*_r2m1{w,w3,b,b3}_norm` twin bit for bit rms_norm into hnb then the plain kernel of
#    that row (output and hnb), and Gpu::qmv_norm against rms_norm + qgemm.
# 2. e2e and graphs as landed, then e2e with MLASERVE_QMV_NORM=1 (the quantized fixtures' one-
#    token steps take the fused norm; their figures must not move: the same bits).
# 3. The attention norm inside the quantized q_proj GEMV (MLASERVE_QMV_NORM=1) against the
#    default (rms_norm's launch), the Q4_K V2-Lite b1 step, three rounds; b2 (never fused) once
#    each as the control. Run 1's marginals (an H100): 27 attention rms_norm launches at ~4.4 µs.
#    Predicted −2 to −3.5 µs a layer, −55 to −95 µs a step (3-6%). If it wins with 0 bits
#    differing: make it the default (executor.rs, quant_norm_allowed) and say so in ARCHITECTURE.
# 4. On an H200 (item 2's card; nothing since session 40's 1,802 µs): the bf16 b1 step against
#    MLASERVE_LM_HEAD_GEMV=0 and MLASERVE_COMBINE_EARLY=0, two rounds.
set -u
RUN=next; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf; Q=/tmp/v2-q4k.gguf
h200=0; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
(timeout 200 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth q4k $(el)" >> $L) &
MLASERVE_OPS=gemms,quantized timeout 250 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops gemms,quantized rc=$? $(el)" >> $L
grep -E "100003|qmv_norm|rows|test result|FAIL" $OUT/ops.txt | tail -50 >> $L
wait
timeout 150 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
timeout 80 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "== graphs rc=$? $(el)" >> $L
MLASERVE_QMV_NORM=1 timeout 150 $B/e2e --test-threads=2 --nocapture > $OUT/tests-norm.txt 2>&1
echo "== e2e QMV_NORM=1 rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/tests.txt $OUT/tests-norm.txt >> $L
rep() { m=$1; b=$2; shift 2; timeout 90 env "$@" $B/decode_profile $m --batch $b --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== q4k b1 round $r: $(rep $Q 1 X=1) $(el)" >> $L
  echo "== q4k b1 round $r QMV_NORM=1: $(rep $Q 1 MLASERVE_QMV_NORM=1) $(el)" >> $L
done
echo "== q4k b2: $(rep $Q 2 X=1) $(el)" >> $L
echo "== q4k b2 QMV_NORM=1: $(rep $Q 2 MLASERVE_QMV_NORM=1) $(el)" >> $L
MLASERVE_QMV_NORM=1 timeout 60 $B/decode_profile $Q --batch 1 --ctx 512 > $OUT/profile-q4k-norm.txt 2>&1
if [ $h200 = 1 ]; then
  rm -f $Q
  timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
  for r in 1; do
    echo "== bf16 b1 round $r: $(rep $M 1 X=1) $(el)" >> $L
    echo "== bf16 b1 round $r LM_HEAD_GEMV=0: $(rep $M 1 MLASERVE_LM_HEAD_GEMV=0) $(el)" >> $L
    echo "== bf16 b1 round $r COMBINE_EARLY=0: $(rep $M 1 MLASERVE_COMBINE_EARLY=0) $(el)" >> $L
  done
fi
echo "end $(el)" >> $L
cat $L; head -16 $OUT/profile-q4k-norm.txt
