#!/usr/bin/env bash
# Session 24, run 6 (the last 240 s of the session's device time): -DMMQ_LEAN — Q4_K's scales
# decoded once a row group (each lane one pair, shared through the warp's shared memory) and
# Q8_0 without the min term's FFMA; the same bits (the lab prints each product's error). The
# variant's lab first (its numbers compare with runs 2-5's default), then the default's.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/lean.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } >> $L
for d in "-DMMQ_LEAN" ""; do
  echo "== lab [$d]: $(el)" >> $L
  env MLASERVE_KERNEL_DEFINES="$d" timeout 100 $B/qgemv --shape 2,4,5 --m 2,8,16 2>&1 | grep -E "^==|qgemm_mmq" >> $L
done
echo "end $(el)" >> $L
cat $L
