#!/usr/bin/env bash
# Session 33, run 5: the pick family after the review's cleanup (grp_owner computing the
# simple draw's target too, GrpWords of 3 words): clusters of 1, 2 and 8, bit for bit RowPick::of.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
export MLASERVE_KERNEL_CACHE=/tmp/kc
nvidia-smi --query-gpu=name,driver_version --format=csv; date -u
MLASERVE_OPS=argmax timeout 200 .device/bin/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$?"
grep -E "logits_pick" $OUT/tests.txt | awk '{print $NF, $(NF-2)}' | sort | uniq -c
grep -E "logits_pick" $OUT/tests.txt | grep -v "err 0.000e0" | head
grep -E "test result|panicked" $OUT/tests.txt | head -3
