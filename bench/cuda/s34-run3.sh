#!/usr/bin/env bash
# Session 34, run 3: run 2's e2e failure (the GLM-DSA Q4_K_M fixture's argmax agreement 0.845
# against 0.85) bisected: the e2e logits test built with 3310c92's kernels (the session's
# start: gemv.cu and moe.cu before this session's two changes), on the same kind of card.
# Build machine: gemv.cu and moe.cu of 3310c92, cargo test --release -p mlaserve-cuda --test
#   e2e --no-run, that binary stripped as e2e_old into .device/pkg/bins.tar.xz.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run3.txt
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } >> $L
timeout 120 $B/e2e_old logits_match_cpu_on_every_fixture_and_path --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "e2e_old rc=$?" >> $L
grep -E "q4_k_m|test result" $OUT/tests.txt | grep -E "rows,|test result" >> $L
cat $L
