#!/usr/bin/env bash
# Session 24, run 4: the landed build (shared slices without the routing's wait by default)
# checked end to end — full op table, e2e, graphs, replays against MLASERVE_SHARED_NOWAIT=0,
# bench b1 — and two measurements for the int8 kernels' next step: Q4_K with its K split
# forced (more warps an SM), and Nsight Compute on qmmq_q4_k_n1 against qmmq_q8_0_n1.
# On the build machine: cargo build ... && tools/device/pack.sh; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/final.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
timeout 120 $B/synth_model v2-lite /tmp/v2-bf16.gguf > /dev/null 2>&1 &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 240 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
timeout 100 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "test result|rows|failing" $OUT/tests.txt >> $L
wait
for i in 1 2; do for v in "" 0; do
  echo "== b1 SHARED_NOWAIT=${v:-default}: $(el)" >> $L
  env ${v:+MLASERVE_SHARED_NOWAIT=$v} timeout 60 $B/decode_profile /tmp/v2-bf16.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
done; done
timeout 150 $B/mlaserve bench --model /tmp/v2-bf16.gguf --device cuda -b 1 -p 512 -n 64 -r 3 >> $L 2>&1; echo "bench rc=$? $(el)" >> $L
rm -f /tmp/v2-bf16.gguf
for sp in "" 2 4; do
  echo "== lab QMMQ_SPLITS=${sp:-rule}: $(el)" >> $L
  env ${sp:+MLASERVE_QMMQ_SPLITS=$sp} timeout 60 $B/qgemv --shape 2,4,5 --m 2,8 2>&1 | grep -E "^==|qgemm_mmq" >> $L
done
for k in qmmq_q4_k_n1 qmmq_q8_0_n1; do
  timeout 120 ncu --clock-control none -k regex:"^$k\$" -c 1 --set full --import-source no \
    $B/qgemv --shape 4 --m 8 > "$OUT/ncu-$k.txt" 2>&1
  echo "ncu $k rc=$? $(el)" >> $L
done
echo "end $(el)" >> $L
cat $L
