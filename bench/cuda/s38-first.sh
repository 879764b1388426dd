#!/usr/bin/env bash
# Prepared in session 37, run as session 38's run 1 (v2lite-s38-run1.txt; v2lite.md, "Thirty-eighth
# session"): BULK +11 µs a step, HALF's step not the attention's (only its trace counts).
# Session 37's run 3 found mla_attn_cl's ~4.5 µs before its PDL wait spent issuing requests:
# the weights' loads (~2,000 clocks) and the first chunk's cp.async copies (~3,850 clocks,
# 65 rows x 1,152 bytes a block; each head's cluster copies the same rows). Two labs on top of
# `attn-pretrace-s37.patch` (`attn-bulk-s37.patch`; the landed cubin unchanged without the
# defines: md5 compared on the build machine):
#   MAC_LAB_BULK  the first chunk by the copy engine: warp 0 issues one cp.async.bulk a row on
#                 an mbarrier (mla_decode.cu's helpers), the scores wait on its phase. If the
#                 copies' issue is the cost, the pre-wait shrinks by most of 3,850 clocks.
#   MAC_LAB_HALF  half of each row copied (wrong results): half the requests and half the bytes,
#                 so it says whether the copies matter at all; with BULK (the same bytes, no
#                 thread issuing them) it tells issue from bytes. Its rows' second halves hold
#                 stale shared memory (most likely the previous layer's rows, finite): if its
#                 step moves more than the attention could, suspect the routing's traffic.
# The op table's attn_cluster family under BULK first (it must pass before its times count).
# Build machine: git apply bench/cuda/attn-pretrace-s37.patch bench/cuda/attn-bulk-s37.patch;
#   the usual builds; LABS=0 tools/device/pack.sh; cp this .device/next.sh;
#   afterwards git checkout crates/cuda/kernels/mla_attn_cl.cu.
# If BULK wins: the next step is sharing each chunk between heads (16-block clusters of two
# heads, one multicast bulk copy a row), which only the copy engine can do.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
V=("" "-DMAC_LAB_BULK" "-DMAC_LAB_HALF")
for d in "${V[@]}"; do
  MLASERVE_KERNEL_DEFINES="$d" timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
  sleep 4
done
for d in "${V[@]:1}"; do
  MLASERVE_KERNEL_TRACE=1 MLASERVE_KERNEL_DEFINES="-DMAC_LAB_PRE_TRACE $d" timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
  sleep 4
done
wait; echo "== compiled $(el)" >> $L
MLASERVE_KERNEL_DEFINES="-DMAC_LAB_BULK" MLASERVE_OPS=attn_cluster timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops-bulk.txt 2>&1
echo "== ops attn_cluster under BULK rc=$? $(el)" >> $L; grep -iE "fail|pass|rows" $OUT/ops-bulk.txt | tail -3 >> $L
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for d in "${V[@]}"; do
    echo "== b1 round $r [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep) $(el)" >> $L
  done
done
for d in "${V[@]:1}"; do
  echo "== pre-wait points [$d]" >> $L
  MLASERVE_KERNEL_TRACE=1 MLASERVE_KERNEL_DEFINES="-DMAC_LAB_PRE_TRACE $d" timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 >> $L 2>&1
done
echo "end $(el)" >> $L
cat $L
