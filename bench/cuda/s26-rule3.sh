#!/usr/bin/env bash
# Session 26, run 5: the landed split rule (long K over half a block an SM or more by the model,
# the rest two blocks an SM capped at one wave) against 9fa5b90's rule (_old binaries): the
# quantized op family, e2e and graphs; the lab (its lines name the splits taken) at 2-64 rows
# on q_proj, o_proj, V2 gate_up, V3 gate/up and down, V3 shared gate|up and q_a, two rounds of
# each binary (old without the last two shapes: it lacks them); the Q4_K V2-Lite model's replays.
# On the build machine: cargo build ... && LABS=1 OLD_QGEMV=/tmp/old26/qgemv
#   OLD_PROFILE=/tmp/old26/decode_profile tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/rule3.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 200 $B/synth_model v2-lite /tmp/v2-q4k.gguf --type q4_k > /dev/null 2>&1 &
MLASERVE_OPS=quantized timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "ops quantized rc=$? $(el)" >> $L
grep -iE "fail|test result" $OUT/ops.txt | head -5 >> $L
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
lab() { grep -E "^==|qgemm_mmq" | grep -v '^|' >> $L; }
for r in 1 2; do
  echo "== lab round $r: $(el)" >> $L
  timeout 120 $B/qgemv --shape 0,1,2,4,5,8,9 --m 2,4,8,16,32,64 2>&1 | lab
  echo "== lab_old round $r: $(el)" >> $L
  timeout 120 $B/qgemv_old --shape 0,1,2,4,5 --m 2,4,8,16,32,64 2>&1 | lab
done
wait
for b in 3 4 8 16 32 64; do for v in "" _old; do
  echo "== q4k b$b$v: $(el)" >> $L
  timeout 60 $B/decode_profile$v /tmp/v2-q4k.gguf --batch $b --replays 100 2>&1 | grep -E "median|rror" >> $L
done; done
echo "end $(el)" >> $L
cat $L
