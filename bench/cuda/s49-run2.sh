#!/usr/bin/env bash
# Session 49, run 2: the kernels compiled by NVRTC straight into a cubin on every core
# (`-split-compile=0`), once a process, cached as the cubin (kernels.rs), against run 1's
# 98.3 s of one-thread PTX and the driver's JIT on a fresh H100 host. Then the op families
# holding the 9 of 157 functions whose SASS split compilation moved (static shared offsets
# and schedule — moe_route, moe_norm_route, gemv_bf16_m1/m2/m4, attn_mha, attn_mqa_split,
# fa_pack_q/kv; NVRTC 12.9 here, the device's may differ), the cubin read back from the cache, and the
# V2-Lite b1 steps against the PTX build (`decode_profile_old`: 2d972aa's, the same kernels),
# two rounds interleaved; e2e.
# The PTX build: `git checkout 2d972aa && cargo build --release -p mlaserve-cuda --example
# decode_profile && cp target/release/examples/decode_profile /tmp/decode_profile_old &&
# git checkout main`, then the new build (pack.sh's header).
# Pack: `OLD_PROFILE=/tmp/decode_profile_old LABS=0 SERVER=0 tools/device/pack.sh`,
# `cp bench/cuda/s49-run2.sh .device/next.sh`; carry [".device"], `bash .device/next.sh`.
# Cut for session 49's last device time (~160 s on an H100): the Q4_K model only, the op
# families that hold the 9 moved functions, no graphs test.
set -u
RUN=s49-run2; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf
timeout 100 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth $(el)" >> $L
MLASERVE_OPS=gemms,elementwise,attention,attention_tc,moe timeout 130 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1 &
OPS=$!
for i in $(seq 1 240); do grep -q "kernels ready" $OUT/ops.txt 2>/dev/null && break; kill -0 $OPS 2>/dev/null || break; sleep 0.5; done
echo "== new build, fresh: $(grep -h 'kernels ready' $OUT/ops.txt) $(el)" >> $L
# the PTX build compiles its own (another cache file) while the op rows run
(timeout 200 $B/decode_profile_old $Q --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1; echo "== old build compiled $(el)" >> $L) &
wait $OPS; echo "== ops (the families of the 9 functions whose SASS moved) rc=$? $(el)" >> $L
grep -E "family|FAIL|rows|test result|panicked|does not fit" $OUT/ops.txt | tail -20 >> $L
wait
MLASERVE_OPS=argmax timeout 100 $B/ops --test-threads=1 --nocapture > $OUT/ops2.txt 2>&1; rc=$?
echo "== new build, cached: $(grep -h 'kernels ready' $OUT/ops2.txt) rc=$rc $(el)" >> $L
rep() { p=$1; m=$2; shift 2; timeout 90 env "$@" $B/$p $m --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  for m in $Q; do
    echo "== $(basename $m) b1 round $r new: $(rep decode_profile $m X=1) $(el)" >> $L
    echo "== $(basename $m) b1 round $r old: $(rep decode_profile_old $m X=1) $(el)" >> $L
  done
done
timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/e2e.txt >> $L
echo "end $(el)" >> $L
cat $L
