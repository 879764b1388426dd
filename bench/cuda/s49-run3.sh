#!/usr/bin/env bash
# Session 49, run 3: `s49-run2.sh` cut to the device time left (~250 s): the cubin build's
# compile on a fresh host (against run 1's 98.3 s), three op families holding 7 of the 9
# functions whose SASS split compilation moved, the cubin read back from the cache, the
# Q4_K V2-Lite b1 step (against run 1's 1,373.0 µs on another H100), e2e. No PTX build
# beside it. Pack as s49-run2.sh; `cp bench/cuda/s49-run3.sh .device/next.sh`.
set -u
RUN=s49-run3; . tools/device/prelude.sh
Q=/tmp/v2-q4k.gguf
MLASERVE_OPS=gemms,attention,moe timeout 80 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops gemms,attention,moe rc=$? $(el)" >> $L
grep -E "kernels ready|family|FAIL|rows|test result|panicked" $OUT/ops.txt | tail -12 >> $L
timeout 60 $B/synth_model v2-lite $Q --type q4_k > /dev/null 2>&1; echo "== synth $(el)" >> $L
MLASERVE_OPS=argmax timeout 30 $B/ops --test-threads=1 --nocapture > $OUT/ops2.txt 2>&1; rc=$?
echo "== cached: $(grep -h 'kernels ready' $OUT/ops2.txt) rc=$rc $(el)" >> $L
rep() { timeout 30 $B/decode_profile $Q --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
echo "== q4k b1 round 1: $(rep) $(el)" >> $L
echo "== q4k b1 round 2: $(rep) $(el)" >> $L
timeout 40 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1; echo "== e2e rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/e2e.txt >> $L
echo "end $(el)" >> $L
cat $L
