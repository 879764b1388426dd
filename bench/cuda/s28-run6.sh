#!/usr/bin/env bash
# Session 28, run 6 (the last device seconds): the landed build's tests (op families argmax,
# moe_grouped, moe, quantized; graphs, e2e) with moe_gemm_wg2 the default, then two lab
# variants, each its own NVRTC build (MLASERVE_KERNEL_DEFINES):
# - -DMWG_GLU with MLASERVE_MOE_GLU=1: the SwiGLU in wg2's gate|up epilogue
#   (moe_gemm_wg2_glu; op rows bit for bit the product into f32 then silu_mul);
# - -DMWG_GLU -DMWG_V2: the copies at fixed trip counts and issued after the k-step's wgmmas
#   (the review's two ideas), with and without the GLU.
# The prefill steps 11 x 128 and 1 x 2048 timed whole and by kernel under each.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run6.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( [ -e /tmp/v2-bf16t.gguf ] || timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OPS=argmax,moe_grouped,moe,quantized MLASERVE_OP_REPORT=$OUT/ops-families.json timeout 240 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; rc=$?
echo "ops (default) rc=$rc $(el)" >> $L; grep -E "test result|past their bound|rows$" $OUT/tests.txt | head -5 >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
timeout 110 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
grep -E "test result|panicked" $OUT/tests.txt | tail -3 >> $L
wait
prof() {  # label, then env assignments for the process
  local label=$1; shift
  for spec in "11 128" "1 2048"; do
    set -- $spec "$@"
    echo "== prefill $1 x $2, $label $(el)" >> $L
    env "${@:3}" timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch $1 --prefill $2 --ctx 0 > $OUT/p.txt 2>&1
    grep -E "prefill step|moe_gemm|silu_mul|rror" $OUT/p.txt | head -4 >> $L
    shift 2
  done
}
prof "default (wg2)" MLASERVE_MOE_GLU=0
for d in "-DMWG_GLU" "-DMWG_GLU -DMWG_V2"; do
  MLASERVE_KERNEL_DEFINES="$d" MLASERVE_MOE_GLU=1 MLASERVE_OPS=moe_grouped timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests-lab.txt 2>&1; rc=$?
  echo "ops moe_grouped [$d] GLU rc=$rc $(el)" >> $L; grep -E "moe_gemm_glu|moe_gemm .*bm64|past their bound" $OUT/tests-lab.txt >> $L
  [ $rc = 0 ] || tail -20 $OUT/tests-lab.txt >> $L
  [ "$d" = "-DMWG_GLU" ] || prof "[$d] no GLU" MLASERVE_KERNEL_DEFINES="$d" MLASERVE_MOE_GLU=0
  prof "[$d] GLU" MLASERVE_KERNEL_DEFINES="$d" MLASERVE_MOE_GLU=1
done
rm -f $OUT/p.txt
echo "end $(el)" >> $L
cat $L
