#!/usr/bin/env bash
# prepared in session 15, not run (no device time left), for the first run of session 16: tests; the landed combine (its twins' SASS is run 5's, every other kernel's a2abb66's: tools/sass_diff.sh) against a2abb66 (decode_profile_old)
set -uo pipefail
export TESTS=1 TYPE=q8_0 PROFILE_BATCHES=" "
bash .device/decode_ab.sh
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/bench.txt
r() { local bin=$1 ty=$2 b=$3; shift 3; echo "== $bin $ty b$b $*: $(env "$@" timeout 40 $B/$bin /tmp/v2-$ty.gguf --batch $b --replays 300 2>&1 | grep -iE 'replays|error|panic' | tr '\n' ' ')" >> $L; }
timeout 120 $B/decode_profile_old /tmp/v2-q8_0.gguf --batch 4 --replays 10 > /dev/null 2>&1
r decode_profile_old q8_0 4 MLASERVE_X=1; r decode_profile q8_0 4 MLASERVE_X=1
r decode_profile_old q8_0 1 MLASERVE_X=1; r decode_profile q8_0 1 MLASERVE_X=1
$B/synth_model v2-lite /tmp/v2-q4_k.gguf --type q4_k > /dev/null 2>&1
r decode_profile_old q4_k 1 MLASERVE_X=1; r decode_profile q4_k 1 MLASERVE_X=1; r decode_profile q4_k 1 MLASERVE_QMV_COMBINE=0
r decode_profile_old q4_k 4 MLASERVE_X=1; r decode_profile q4_k 4 MLASERVE_X=1
r decode_profile_old q8_0 2 MLASERVE_X=1; r decode_profile q8_0 2 MLASERVE_X=1
grep -E "rc=|test result|FAIL|panic|past their bound" $OUT/tests.txt | head -20
cat $L
