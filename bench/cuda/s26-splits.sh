#!/usr/bin/env bash
# Session 26, run 2: the int8 kernel's split along K swept on the landed kernels (9fa5b90):
# MLASERVE_QMMQ_SPLITS = 1, 2, 3, 4, 6 against the rule (splits only where the row blocks are
# fewer than two an SM), Q4_K and Q8_0, the large MLP shapes at 2-32 rows. Question: does q8u's
# cheaper Q4_K chunk make a split rule of its own pay (session 24: 4 splits 39.2 -> 33.8 µs on
# V3 gate/up M8 before q8u)?
# On the build machine: cargo build ... && LABS=1 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/splits.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
for r in 1 2; do for s in rule 1 2 3 4 6; do
  echo "== round $r splits $s: $(el)" >> $L
  if [ $s = rule ]; then e=""; else e="MLASERVE_QMMQ_SPLITS=$s"; fi
  env $e timeout 120 $B/qgemv --shape 2,3,4,5 --m 2,4,8,16,32 > $OUT/lab-$s.txt 2>&1; echo "rc=$?" >> $L
  grep -E "^==|qgemm_mmq" $OUT/lab-$s.txt | grep -v '^|' >> $L
done; done
echo "end $(el)" >> $L
cat $L
