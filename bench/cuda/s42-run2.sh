#!/usr/bin/env bash
# Prepared in session 42 (not run there: no machine was lent); RAN in session 43 after
# s42-first.sh in the same call, on an H100 (v2lite-s43-run2.txt), on its pack (with read_bw
# packed too). Where the
# bf16 b1 step's time goes, kernel by kernel, on the card:
# - the per-kernel profile (an event after each kernel);
# - then each of its nine largest kernels' marginal cost in the pipelined step
#   (MLASERVE_LAB_TWICE=name: how much the step grows when each launch of it is made twice),
#   against plain steps before and after;
# - read_bw's ceilings, and the step's GEMVs alone.
set -u
RUN=run2; . tools/device/prelude.sh
M=/tmp/v2-bf16t.gguf
[ -f $M ] || { timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L; }
timeout 120 $B/decode_profile $M --batch 1 --ctx 512 > $OUT/profile-b1.txt 2>&1
echo "== profile rc=$? $(el)" >> $L
rep() { timeout 90 env "$@" $B/decode_profile $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
echo "== plain: $(rep X=1) $(el)" >> $L
for k in $(grep -E '^\| [a-z_0-9]+ \|' $OUT/profile-b1.txt | grep -vE '^\| (gemm|label) ' | awk '{print $2}' | head -9); do
  echo "== twice $k: $(rep MLASERVE_LAB_TWICE=$k) $(el)" >> $L
done
echo "== plain: $(rep X=1) $(el)" >> $L
echo "== read_bw" >> $L
timeout 100 $B/read_bw 2>&1 | grep -E "lab_read_u4 x 8|lab_copy|moe_|gemv_bf16|swiglu" >> $L
echo "end $(el)" >> $L
cat $L; head -60 $OUT/profile-b1.txt
