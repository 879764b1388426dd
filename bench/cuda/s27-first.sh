#!/usr/bin/env bash
# The next session's first device run, prepared in session 26 (no device time left for it):
# 1. the build as landed: the whole op table (its new Q4_K 4,224 x 4,096 case takes the
#    busiest-SM split model's 2 splits: not yet run), e2e, graphs, bf16 b1 (item 2), the Q4_K
#    model at 3-64 rows;
# 2. the lab variant -DMMQ_FUSE_X with MLASERVE_QMMQ_FUSE_X=1 (1-8-row launches whose blocks
#    walk at most 2 chunks quantize x themselves: no q8_quantize_mmq launch, ~1.8 µs each inside
#    the 8-row step by run 7): the quantized op family under it (its "qgemm_mmq fused x" rows:
#    bit for bit against the unfused path at 1-8 rows) and e2e, then the Q4_K model's
#    replays at 5/8/16/64 rows against the default, two rounds interleaved, and the lab.
# On the build machine: cargo build ... && LABS=1 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
(timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1;
 timeout 200 $B/synth_model v2-lite /tmp/v2-bf16.gguf > /dev/null 2>&1) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 240 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
timeout 100 $B/e2e --test-threads=2 --nocapture >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
grep -E "q4_k_m.gguf: |FAIL" $OUT/tests.txt >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
echo "== bf16 b1: $(el)" >> $L
timeout 60 $B/decode_profile /tmp/v2-bf16.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
FX="MLASERVE_KERNEL_DEFINES=-DMMQ_FUSE_X MLASERVE_QMMQ_FUSE_X=1"
env $FX MLASERVE_OPS=quantized timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/ops-fx.txt 2>&1
echo "ops quantized, fused x: rc=$? $(el)" >> $L
grep -iE "fail|test result" $OUT/ops-fx.txt | head -5 >> $L
grep -E "fused x" $OUT/ops-fx.txt | head -12 >> $L
env $FX timeout 100 $B/e2e --test-threads=2 > $OUT/e2e-fx.txt 2>&1; echo "e2e fused x rc=$? $(el)" >> $L
for r in 1 2; do for b in 5 8 16 64; do for v in default fx; do
  echo "== q4k b$b $v: $(el)" >> $L
  if [ $v = fx ]; then e=$FX; else e=""; fi
  env $e timeout 60 $B/decode_profile /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done; done
for v in default fx; do
  echo "== lab $v: $(el)" >> $L
  if [ $v = fx ]; then e=$FX; else e=""; fi
  env $e timeout 60 $B/qgemv --shape 0,1,9 --m 5,8 2>&1 | grep -E "^==|qgemm_mmq|rror" | grep -v '^|' >> $L
done
echo "end $(el)" >> $L
cat $L
