#!/usr/bin/env bash
# Session 45, run 2 as it ran (s45-run2.sh stopped at once: lent an H100): on the same warm
# H100, the flipped default (the quantized attention norm on) against MLASERVE_QMV_NORM=0 in
# the new build's decode_profile, the Q4_K V2-Lite b1 step, two rounds interleaved.
RUN=run2b; . tools/device/prelude.sh; Q=/tmp/v2-q4k.gguf
timeout 100 $B/synth_model v2-lite $Q --type q4_k >/dev/null 2>&1; echo "synth $(el)" >> $L
rep() { t=$1; shift; timeout $t env "$@" $B/decode_profile $Q --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
echo "== q4k b1 default (compiles): $(rep 200 X=1) $(el)" >> $L
echo "== q4k b1 QMV_NORM=0: $(rep 90 MLASERVE_QMV_NORM=0) $(el)" >> $L
echo "== q4k b1 default: $(rep 90 X=1) $(el)" >> $L
echo "== q4k b1 QMV_NORM=0: $(rep 90 MLASERVE_QMV_NORM=0) $(el)" >> $L
cat $L
