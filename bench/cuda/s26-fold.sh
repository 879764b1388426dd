#!/usr/bin/env bash
# Session 26, run 6: a split launch's partial sums folded by its own last block of each row
# block (mmq_fold) against the separate qgemm_reduce launch (MLASERVE_QMMQ_FOLD=0), one binary:
# the quantized op family (with the new fold rows: the same bits as qgemm_reduce, three launches
# in a row), e2e and graphs; the lab at 8 and 32 rows on q_proj, o_proj, V3 gate/up and down;
# the Q4_K V2-Lite model's replays at 5/8/16/64 rows, two rounds interleaved.
# On the build machine: cargo build ... && LABS=1 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/fold.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OPS=quantized MLASERVE_OP_REPORT=$OUT/ops-q.json timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized rc=$? $(el)" >> $L
grep -iE "fail|test result" $OUT/ops.txt | head -5 >> $L
grep -E "qgemm_mmq fold" $OUT/ops.txt | head -8 >> $L
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
for f in 1 0; do
  echo "== lab fold=$f: $(el)" >> $L
  MLASERVE_QMMQ_FOLD=$f timeout 120 $B/qgemv --shape 0,1,4,5 --m 8,32 2>&1 | grep -E "^==|qgemm_mmq" | grep -v '^|' >> $L
done
wait
for r in 1 2; do for b in 5 8 16 64; do for f in 1 0; do
  echo "== q4k b$b fold=$f: $(el)" >> $L
  MLASERVE_QMMQ_FOLD=$f timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
echo "end $(el)" >> $L
cat $L
