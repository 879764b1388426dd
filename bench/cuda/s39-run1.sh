#!/usr/bin/env bash
# Session 39's run 1 (v2lite-s39-run1.txt; v2lite.md, "Thirty-ninth session"): one grid +153 µs a
# step, MAC_H2 +33, neither landed. The one-grid code is qkv-attn-s39.patch as run 2 ran it;
# this run had 16-row GEMV blocks (gemv_split returning (ceil(rows / 16) in clusters, 16)) and
# no MLA_PDL_WAIT() in mac_wait_ready.
# What it measured: the q|kv_a GEMV and the cluster attention in one grid (mla_qkv_attn_cl,
# MLASERVE_QKV_ATTN, default on in this build) against the two launches (MLASERVE_QKV_ATTN=0)
# in the same binary, and session 38's two heads a cluster (attn-h2-s38.patch, -DMAC_H2) as
# decode_profile_h2 (built from the patched landed tree, as s39-first.sh prepared).
# Session 37's timeline: the attention's blocks start only as the GEMV's leave (its K held in
# registers fills the register file), so their ~4 µs before the wait lie on the step's path.
# Here the attention's 128 blocks come first in a grid with the GEMV's 232 and wait on a
# counter the GEMV's blocks raise; predicted: the attention's pre-wait hidden under the GEMV's
# stream, up to ~4 µs a layer (~100 µs a step), less whatever the GEMV loses on the ~68 SMs
# the attention leaves it.
# Build machine: the usual builds; a package of ops, e2e, graphs, decode_profile, synth_model
# and /tmp/decode_profile_h2 (no mlaserve binary: the carry limit); cp this .device/next.sh.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2
MLASERVE_KERNEL_TRACE=1 timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2
MLASERVE_KERNEL_DEFINES="-DMAC_H2" timeout 200 $B/decode_profile_h2 $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
MLASERVE_OPS=attn_cluster,gemms MLASERVE_OP_REPORT=$OUT/ops-qkv.json timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops attn_cluster,gemms rc=$? $(el)" >> $L; grep -E "qkv|rows|test result" $OUT/ops.txt | tail -14 >> $L
timeout 150 $B/graphs --test-threads=1 > $OUT/graphs.txt 2>&1
echo "== graphs rc=$? $(el)" >> $L; grep -E "test result" $OUT/graphs.txt >> $L
rep() { timeout 90 "$@" $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r two launches: $(MLASERVE_QKV_ATTN=0 rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r one grid: $(rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r h2: $(MLASERVE_KERNEL_DEFINES=-DMAC_H2 rep $B/decode_profile_h2) $(el)" >> $L
done
for q in 1 0; do
  echo "== phase points [MLASERVE_QKV_ATTN=$q]" >> $L
  MLASERVE_QKV_ATTN=$q MLASERVE_KERNEL_TRACE=1 timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 >> $L 2>&1
done
MLASERVE_E2E_REPORT=$OUT/e2e-report.json timeout 200 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1
echo "== e2e rc=$? $(el)" >> $L; grep -E "test result|FAIL|panicked" $OUT/e2e.txt | head -5 >> $L
echo "end $(el)" >> $L
cat $L
