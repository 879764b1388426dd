#!/usr/bin/env bash
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/lab.tar.xz -C .device/bin
export MLASERVE_KERNEL_CACHE=/tmp/kc
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } > $OUT/lab.txt
timeout 400 .device/bin/logits_pick >> $OUT/lab.txt 2>&1; echo "rc=$?" >> $OUT/lab.txt
cat $OUT/lab.txt
