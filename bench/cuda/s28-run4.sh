#!/usr/bin/env bash
# Session 28, run 4: the grouped expert GEMM on wgmma (moe_gemm_wg: 64 x 256 blocks, two
# warpgroups) in place of moe_gemm_m4 (mma.sync, 64 x 128) for bf16 experts in 64-row tiles.
# Run 3b: moe_gemm_m4 was 66-67% of every prefill step (595 µs a call at 1,408 tokens,
# ~123-130 TFLOP/s). Tests (op families moe_grouped, argmax; graphs; e2e), then the prefill
# steps whole and by kernel, and pp512, with MLASERVE_MOE_WGMMA=0 (mma.sync) / default.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run4.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( [ -e /tmp/v2-bf16t.gguf ] || timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OPS=moe_grouped,argmax timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; rc=$?; echo "ops rc=$rc $(el)" >> $L
grep -E "moe_gemm |moe_sort|test result|FAIL|past their bound" $OUT/tests.txt | head -40 >> $L
[ $rc = 0 ] || tail -30 $OUT/tests.txt >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
timeout 110 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
grep -E "test result|panicked" $OUT/tests.txt | tail -4 >> $L
wait
for spec in "11 128 0" "1 2048 0"; do
  set -- $spec
  for w in 0 1; do
    echo "== prefill batch $1 x $2 at ctx $3, MLASERVE_MOE_WGMMA=$w $(el)" >> $L
    MLASERVE_MOE_WGMMA=$w timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch $1 --prefill $2 --ctx $3 > $OUT/prefill-$1x$2-w$w.txt 2>&1
    echo "rc=$?" >> $L
    grep -E "prefill step|step of|moe_gemm|silu_mul|rror" $OUT/prefill-$1x$2-w$w.txt | head -8 >> $L
  done
done
for w in 0 1 0 1; do
  echo "== bench pp512, MLASERVE_MOE_WGMMA=$w $(el)" >> $L
  MLASERVE_MOE_WGMMA=$w timeout 80 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 512 -n 0 -r 5 2>&1 | grep -E "^\|" | tail -1 >> $L
done
echo "end $(el)" >> $L
cat $L
