#!/usr/bin/env bash
# Session 39's run 2 (v2lite-s39-run2.txt; v2lite.md, "Thirty-ninth session"): +191 µs a step,
# slower than run 1's two waves; not landed: the code is qkv-attn-s39.patch (git apply it first).
# What it measured: mla_qkv_attn_cl with its GEMV in one wave. Run 1 (s39-run1.sh): the
# fused grid's 232 GEMV blocks of 16 rows found only the 136 slots the attention's 128 blocks
# leave, ran in two waves, and the attention waited 21,115 clocks for them: the step +153 µs.
# Now the host sizes the GEMV to those slots (V2-Lite: 136 blocks of 27 rows, 16 in registers
# as before, 11 staged in shared memory by cp.async, all requested before the wait).
# Predicted: the GEMV's phase back to its two-launch time (~7 µs), the attention's pre-wait
# under it: up to −4 µs a layer, if the two's traffic does not slow the stream.
# Then the executor's path GPU against CPU (tools/check_gpu_synth.py, one-layer V2-Lite, one
# token a step: the only model that takes mla_qkv_attn_cl; no test fixture has the 512 + 64
# latent row).
# Build machine: the usual builds; ops, graphs, mlaserve, decode_profile, synth_model packed
# by hand; cp this .device/next.sh; glm_moe_dsa's hf/model.safetensors and -f32.gguf moved
# out of the tree while carried (the carry limit; nothing here reads them).
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
M=/tmp/v2-bf16t.gguf
timeout 200 $B/synth_model v2-lite $M --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L
timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
sleep 2
MLASERVE_KERNEL_TRACE=1 timeout 200 $B/decode_profile $M --batch 1 --ctx 512 --replays 5 > /dev/null 2>&1 &
wait; echo "== compiled $(el)" >> $L
MLASERVE_OPS=attn_cluster,gemms MLASERVE_OP_REPORT=$OUT/ops-qkv.json timeout 150 $B/ops --test-threads=1 --nocapture > $OUT/ops.txt 2>&1
echo "== ops attn_cluster,gemms rc=$? $(el)" >> $L; grep -E "qkv|rows|test result" $OUT/ops.txt | tail -14 >> $L
timeout 150 $B/graphs --test-threads=1 > $OUT/graphs.txt 2>&1
echo "== graphs rc=$? $(el)" >> $L; grep -E "test result" $OUT/graphs.txt >> $L
rep() { timeout 90 "$@" $M --batch 1 --ctx 512 --replays 300 2>&1 | grep -iE "median" | head -1; }
for r in 1 2; do
  echo "== b1 round $r two launches: $(MLASERVE_QKV_ATTN=0 rep $B/decode_profile) $(el)" >> $L
  echo "== b1 round $r one grid: $(rep $B/decode_profile) $(el)" >> $L
done
echo "== phase points [one grid]" >> $L
MLASERVE_KERNEL_TRACE=1 timeout 90 $B/decode_profile $M --batch 1 --ctx 512 --replays 300 >> $L 2>&1
C="python3 tools/check_gpu_synth.py --mlaserve $B/mlaserve --synth $B/synth_model --dir /tmp/synth"
echo "== check_gpu_synth v2-lite decode" >> $L
timeout 120 $C --models v2-lite --paths decode >> $L 2>&1; echo "rc=$? $(el)" >> $L
echo "end $(el)" >> $L
cat $L
