#!/usr/bin/env bash
# Session 41's run 2 (v2lite.md, "Forty-first session"): the combine's first weights before
# its wait, landed (tab_on bit 1 from Gpu::moe_gemv_combine_after, the executor's b1 chain),
# against the build before it (decode_profile_old: b117da5's kernels) and against itself with
# MLASERVE_COMBINE_EARLY=0; and -DMOE_CE2 (moe-ce2-s41.patch: the second item's first four K
# steps too, by cp.async into shared memory). The expert GEMVs' marginal costs
# (MLASERVE_LAB_TWICE); the moe op family (default and CE2), e2e, graphs.
# Build machine: git apply bench/cuda/moe-ce2-s41.patch; cargo build --release -p
# mlaserve-cuda --examples, synth_model, the test binaries; read_bw, decode_profile,
# synth_model, ops, e2e, graphs and b117da5's decode_profile as decode_profile_old packed by
# hand into .device/pkg/bins.tar.xz; the patch taken out; cp this .device/next.sh.
set -u
RUN=run2; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2; timeout 250 $B/decode_profile_old $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2; MLASERVE_KERNEL_DEFINES="-DMOE_CE2" timeout 250 $B/read_bw > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
for v in "" "-DMOE_CE2"; do
  MLASERVE_OPS=moe MLASERVE_KERNEL_DEFINES="$v" timeout 100 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
  echo "== ops moe [$v] rc=$? $(el)" >> $L; grep -E "ids final|rows|test result|FAIL" $OUT/ops.txt | tail -4 >> $L
done
rep() { timeout 90 $1 $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for k in moe_gemv_swiglu moe_gemv_combine; do
  echo "== b1 twice $k: $(MLASERVE_LAB_TWICE=$k rep $B/decode_profile) $(el)" >> $L
done
for r in 1 2; do
  echo "== b1 round $r old (b117da5): $(rep $B/decode_profile_old) $(el)" >> $L
  echo "== b1 round $r new: $(rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r new EARLY=0: $(MLASERVE_COMBINE_EARLY=0 rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r new [-DMOE_CE2]: $(MLASERVE_KERNEL_DEFINES=-DMOE_CE2 rep $B/decode_profile) $(el)" >> $L
done
echo "== read_bw (landed kernels)" >> $L
timeout 100 $B/read_bw 2>&1 | grep -E "lab_read_u4 x 8|lab_copy|swiglu|moe_|gemv_bf16|sink" >> $L
echo "== read_bw [-DMOE_CE2]" >> $L
MLASERVE_KERNEL_DEFINES=-DMOE_CE2 timeout 100 $B/read_bw 2>&1 | grep -E "moe_|sink" >> $L
timeout 150 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
timeout 80 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "== graphs rc=$? $(el)" >> $L
grep -E "test result" $OUT/tests.txt >> $L
echo "end $(el)" >> $L
cat $L
