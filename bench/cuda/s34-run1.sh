#!/usr/bin/env bash
# Session 34, run 1: two changes to a b1 decode step's latency chain, each with the old code
# behind a kernel define in the same binary (MLASERVE_KERNEL_DEFINES), so every comparison is
# one binary in one run:
#   - moe_norm_route_cl's logits stored locally, published by a plain cluster barrier and
#     pulled by block 0 (old: pushed into block 0 with st.shared::cluster before a release
#     barrier; -DMNR_PUSH);
#   - gemv_bf16_m1 loads all 8 K steps of K <= 2,048 before its PDL wait (old: 4; -DGEMV_PRE1=4).
# The whole op table and the graph tests on the default build, then decode_profile replays at
# b1 (two rounds of the four builds interleaved) and b4, and each changed kernel's marginal
# cost (MLASERVE_LAB_TWICE) old / new.
# Build machine: cargo build --release -p mlaserve && cargo build --release -p mlaserve-cuda
#   --examples && cargo build --release -p mlaserve-model --example synth_model && cargo test
#   --release -p mlaserve-cuda --no-run; LABS=0 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 240 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "test result|FAILED|panicked|rows,|failing" $OUT/tests.txt | head -20 >> $L
wait
# Compile the three other define sets while nothing is timed (the kernel cache keeps them).
for d in "-DMNR_PUSH -DGEMV_PRE1=4" "-DGEMV_PRE1=4" "-DMNR_PUSH"; do
  MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1
  echo "== compiled [$d] $(el)" >> $L
done
rep() { timeout 90 $B/decode_profile /tmp/v2-bf16t.gguf --batch $1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for d in "" "-DMNR_PUSH -DGEMV_PRE1=4" "-DGEMV_PRE1=4" "-DMNR_PUSH"; do
    echo "== b1 round $r [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep 1) $(el)" >> $L
  done
done
for d in "" "-DMNR_PUSH -DGEMV_PRE1=4"; do
  echo "== b4 [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep 4) $(el)" >> $L
done
for k in moe_norm_route_cl gemv_bf16_m1; do
  for d in "" "-DMNR_PUSH -DGEMV_PRE1=4"; do
    [ $(( $(date +%s) - S )) -gt 560 ] && { echo "== out of time before $k" >> $L; break 2; }
    echo "== twice $k [$d]: $(MLASERVE_LAB_TWICE=$k MLASERVE_KERNEL_DEFINES="$d" rep 1) $(el)" >> $L
  done
done
echo "end $(el)" >> $L
cat $L
