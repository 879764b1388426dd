#!/usr/bin/env bash
# Session 34, run 2: the landed build (fc92378's kernels with the lab switches removed: the
# same cubin as run 1's default, md5 checked on the build machine) — e2e and graph tests,
# b1 replays (item 2's figure on this card) against decode_profile_old (3310c92's kernels: the
# session's start) in the same run, two rounds interleaved.
# Build machine: as run 1; decode_profile_old built with gemv.cu and moe.cu of 3310c92;
#   OLD_PROFILE=that LABS=0 tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
timeout 200 $B/e2e --test-threads=2 --nocapture > $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "test result|FAILED|panicked|median row|agreement" $OUT/tests.txt | head -30 >> $L
wait
timeout 120 $B/decode_profile_old /tmp/v2-bf16t.gguf --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1  # its kernels compiled
for r in 1 2; do
  for p in decode_profile decode_profile_old; do
    echo "== b1 replays $r $p: $(timeout 90 $B/$p /tmp/v2-bf16t.gguf --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE median | head -1) $(el)" >> $L
  done
done
echo "end $(el)" >> $L
cat $L
