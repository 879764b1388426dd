#!/usr/bin/env bash
# Session 40's run 2 (v2lite.md, "Fortieth session"): where moe_gemv_swiglu loses to its own
# loads, and whether more resident blocks recover it. Ran 23:28 UTC on an H100 80GB HBM3 (asked
# for an H200; v2lite-s40-run2.txt): the arithmetic costs swiglu 2.5 µs of its 3.6 over its
# loads alone (the lookup 0.6, the table 0.45); in the step it runs at 96% of the read
# ceiling already (31.1 µs marginal), the combine at 92%; MOE_MINB=5 +167 µs a step, MOE_G2
# +14, both +87: none landed. The defines are moe-lab-s40.patch (git apply it first).
# Run 1 (s40-run1.sh, an H200): a kernel that only reads streams 4.47-4.59 TB/s over 1 GiB and
# 4.0-4.28 over a 92 MB launch (the copy 3.90, bytes read + written); the expert GEMV's access
# pattern without its arithmetic 4,276 GB/s, moe_gemv_swiglu itself 3,551 (26.0 µs against
# 21.6), moe_gemv_combine 3,009; 8 K steps in flight and ld.global.nc(+L2 256B) no help.
# 1. read_bw (landed kernels), now with moe_gemv_swiglu taken apart: lab_swiglu_m0 (its loads),
#    m1 (+ its arithmetic, sums, store), m2 (+ ids[p] -> pointer table after the wait).
# 2. The expert GEMVs bounded for 5 blocks an SM (-DMOE_MINB=5: 48 registers, 52 bytes
#    spilled; landed: 56, 4 blocks): more warps to cover each warp's time without
#    loads in flight. Each: the moe op family, read_bw's expert rows, the b1 step (two rounds
#    interleaved with the landed build).
# 3. A warp two rows of moe_gemv_swiglu (gate and up of i, i + 1: four rows, two K steps of
#    each in flight, the same 8 loads a warp; the matrix's lookup after the wait paid once for
#    twice the bytes; half the blocks): -DMOE_G2 (68 registers, 3 blocks an SM) and with
#    -DMOE_MINB=4 (64, 16 bytes spilled, 4 blocks). Same tests and timings as 2.
# 4. The two expert GEMVs' marginal cost in the step on this card (MLASERVE_LAB_TWICE).
# Build machine: as s40-run1.sh.
set -u
RUN=run2; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
VARS=("-DMOE_MINB=5" "-DMOE_G2" "-DMOE_G2 -DMOE_MINB=4")
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 250 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
for v in "${VARS[@]}"; do  # (read_bw compiles as decode_profile does, without 31 GB a process)
  sleep 2; MLASERVE_KERNEL_DEFINES="$v" timeout 250 $B/read_bw > /dev/null 2>&1 &
done
wait; echo "== compiled $(el)" >> $L
echo "== read_bw (landed kernels)" >> $L
timeout 150 $B/read_bw >> $L 2>&1; echo "rc=$? $(el)" >> $L
for v in "${VARS[@]}"; do
  echo "== read_bw [$v]: its expert rows" >> $L
  MLASERVE_KERNEL_DEFINES="$v" timeout 150 $B/read_bw 2>&1 | grep -E "moe_|swiglu|sink" >> $L
  MLASERVE_OPS=moe MLASERVE_KERNEL_DEFINES="$v" timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
  echo "== ops moe [$v] rc=$? $(el)" >> $L; grep -E "rows|test result|FAIL" $OUT/ops.txt | tail -3 >> $L
done
rep() { timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r landed: $(rep) $(el)" >> $L
  for v in "${VARS[@]}"; do
    echo "== b1 round $r [$v]: $(MLASERVE_KERNEL_DEFINES="$v" rep) $(el)" >> $L
  done
done
for k in moe_gemv_swiglu moe_gemv_combine; do
  echo "== b1 twice $k: $(MLASERVE_LAB_TWICE=$k rep) $(el)" >> $L
done
echo "== b1 landed: $(rep) $(el)" >> $L
echo "end $(el)" >> $L
cat $L
