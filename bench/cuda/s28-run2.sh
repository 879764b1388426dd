#!/usr/bin/env bash
# Session 28, run 2 (right after run 1, same machine: its /tmp model and kernel cache): the
# serving sweep (bench/serving/bench_serving.py, 128 prompt / 64 output tokens, greedy,
# concurrency 1-256, session 27's settings) with greedy steps' logits copied whole
# (MLASERVE_DEVICE_ARGMAX=0) and reduced on the device, the engine's step times by kind
# from /metrics after each sweep.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
[ -e /tmp/v2-bf16t.gguf ] || timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1
for a in 0 1; do
  MLASERVE_DEVICE_ARGMAX=$a $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > $OUT/serve-a$a.log 2>&1 &
  SP=$!
  for i in $(seq 1 150); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== sweep device argmax $a $(el)" >> $L
  timeout 150 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 \
    --vocab-size 102400 --out $OUT/serve-a$a.json 2>&1 | grep -E "^concurrency" >> $L
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" > $OUT/metrics-a$a.txt 2>&1
  grep -E "^mlaserve:engine_step" $OUT/metrics-a$a.txt >> $L
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
