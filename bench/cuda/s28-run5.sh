#!/usr/bin/env bash
# Session 28, run 5: moe_gemm_wg2 (two 64-row m-tiles of an expert a block, m64n256 a
# warpgroup: 4 MFLOP for 48 KB a stage) against moe_gemm_wg (run 4: 2 MFLOP for 40 KB) and
# moe_gemm_m4; then the serving sweep (greedy, 128 / 64 tokens, concurrency 1-256) with each
# (MLASERVE_MOE_WGMMA = 0 mma.sync, 1 wg, 2 wg2), the engine's step times from /metrics.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run5.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
( [ -e /tmp/v2-bf16t.gguf ] || timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
for w in 2 1; do
  MLASERVE_MOE_WGMMA=$w MLASERVE_OPS=moe_grouped timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests-w$w.txt 2>&1; rc=$?; echo "ops moe_grouped MLASERVE_MOE_WGMMA=$w rc=$rc $(el)" >> $L
  grep -E "moe_gemm .*bm64|past their bound" $OUT/tests-w$w.txt | head -12 >> $L
  [ $rc = 0 ] || tail -20 $OUT/tests-w$w.txt >> $L
done
MLASERVE_MOE_WGMMA=2 timeout 60 $B/graphs --test-threads=1 >> $OUT/tests-w2.txt 2>&1; echo "graphs (wg2) rc=$? $(el)" >> $L
wait
for spec in "11 128 0:1" "11 128 0:2" "1 2048 0:2" "16 128 128:1" "16 128 128:2"; do
  w=${spec#*:}; set -- ${spec%:*}
  echo "== prefill batch $1 x $2 at ctx $3, MLASERVE_MOE_WGMMA=$w $(el)" >> $L
  MLASERVE_MOE_WGMMA=$w timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch $1 --prefill $2 --ctx $3 > $OUT/prefill-$1x$2c$3-w$w.txt 2>&1
  echo "rc=$?" >> $L
  grep -E "prefill step|step of|moe_gemm|rror" $OUT/prefill-$1x$2c$3-w$w.txt | head -4 >> $L
done
for w in 0 1 2; do
  MLASERVE_MOE_WGMMA=$w $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > $OUT/serve-w$w.log 2>&1 &
  SP=$!
  for i in $(seq 1 150); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== sweep MLASERVE_MOE_WGMMA=$w $(el)" >> $L
  timeout 150 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 \
    --vocab-size 102400 --out $OUT/serve-w$w.json 2>&1 | grep -E "^concurrency" >> $L
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" > $OUT/metrics-w$w.txt 2>&1
  grep -E "^mlaserve:engine_step" $OUT/metrics-w$w.txt >> $L
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
