#!/usr/bin/env bash
# Session 28, run 7 (the last ~190 device seconds): the landed source (run 6's
# -DMWG_GLU -DMWG_V2 variants made the default, the #ifdefs removed) compiled by NVRTC and
# its op families moe_grouped (with the GLU rows, now on by default) and argmax.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run7.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } >> $L
MLASERVE_OPS=moe_grouped,argmax timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; rc=$?
echo "ops moe_grouped,argmax rc=$rc $(el)" >> $L
grep -E "moe_gemm_glu|moe_gemm .*bm64|logits_argmax|test result|past their bound" $OUT/tests.txt >> $L
[ $rc = 0 ] || tail -20 $OUT/tests.txt >> $L
cat $L
