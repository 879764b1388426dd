#!/usr/bin/env bash
# Prepared in session 38 for the next session's first run (not run: eleven refused starts
# spent the session's device time after its run 1). Session 39 did not run it as written: its
# MAC_H2 build ran in s39-run1.sh beside that session's one-grid build (+33 µs a step;
# v2lite.md, "Thirty-ninth session").
# mla_attn_cl with two heads of a token a cluster (`attn-h2-s38.patch`, lab define MAC_H2).
# Session 38's run 1 (`s38-first.sh`) found the first chunk's copies cost the same issued by
# the copy engine (BULK +11 µs a step; its copies' phase 4,396 clocks against 3,850), so the
# bytes, not the requests' issue, set the pre-wait's time: 16 heads' clusters copy the same
# 590 KB of latent rows. Under MAC_H2 a block serves heads 2g and 2g + 1 over its eighth of
# the keys: each row copied once for both (75 KB an SM where two blocks an SM copied 150), the
# same weights' bytes an SM (2 x 32 KB), the scores and P·V reading each row from shared
# memory once for two heads; 64 blocks, one an SM (185 registers, 108,696 bytes of shared
# memory), against 128 two an SM; each head's sums in the same order, so the same bits.
# The Rust side (mla_cluster.rs) launches T * N/2 * 8 blocks when MLASERVE_KERNEL_DEFINES
# holds -DMAC_H2 (or -DMAC_H2=...). The patched source without the define (generic over
# MAC_HB = 1, 124 registers) compiles to SASS a shift and some reordering away from the landed
# one (cuobjdump), so the landed kernel runs too (decode_profile_old). A helper's read of the
# patch (session 38) found no bug: barriers, per-head shared arrays, the v2 load's alignment,
# the struct's size and the Rust grid agree.
# Build machine: cargo build --release -p mlaserve-cuda --example decode_profile on the
#   landed tree, cp target/release/examples/decode_profile /tmp/decode_profile_landed;
#   git apply bench/cuda/attn-h2-s38.patch; the usual builds;
#   OLD_PROFILE=/tmp/decode_profile_landed LABS=0 tools/device/pack.sh; cp this .device/next.sh;
#   carry .device (move ~10 MB of fixtures the run does not read out of the tree while it is
#   carried: glm_moe_dsa's hf/model.safetensors and -f32.gguf, then back);
#   afterwards git checkout crates/cuda/kernels/mla_attn_cl.cu crates/cuda/src/mla_cluster.rs.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run1.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
for d in "" "-DMAC_H2"; do
  MLASERVE_KERNEL_DEFINES="$d" timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
  sleep 3
  MLASERVE_KERNEL_TRACE=1 MLASERVE_KERNEL_DEFINES="$d" timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
  sleep 3
done
timeout 200 $B/decode_profile_old $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
for d in "-DMAC_H2" ""; do
  MLASERVE_KERNEL_DEFINES="$d" MLASERVE_OPS=attn_cluster timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops$d.txt 2>&1
  echo "== ops attn_cluster [$d] rc=$? $(el)" >> $L; grep -iE "rows|test result" $OUT/ops$d.txt | tail -2 >> $L
done
rep() { timeout 90 $1 $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r landed: $(rep $B/decode_profile_old) $(el)" >> $L
  for d in "" "-DMAC_H2"; do
    echo "== b1 round $r [$d]: $(MLASERVE_KERNEL_DEFINES="$d" rep $B/decode_profile) $(el)" >> $L
  done
done
for d in "" "-DMAC_H2"; do
  echo "== phase points [$d]" >> $L
  MLASERVE_KERNEL_TRACE=1 MLASERVE_KERNEL_DEFINES="$d" timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 >> $L 2>&1
done
MLASERVE_KERNEL_DEFINES="-DMAC_H2" timeout 150 $B/graphs --test-threads=1 --nocapture > $OUT/graphs-h2.txt 2>&1
echo "== graphs [-DMAC_H2] rc=$? $(el)" >> $L; grep -E "test result" $OUT/graphs-h2.txt >> $L
echo "end $(el)" >> $L
cat $L
