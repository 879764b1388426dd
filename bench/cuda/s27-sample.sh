#!/usr/bin/env bash
# Session 27, run 6 (the session's last ~270 device seconds): the serving sweep at 64
# concurrent requests with temperature 0.8 (OpenAI-style sampling, not greedy), the build
# that samples a step's rows in parallel (9a929af) against the one before (7c26b80's, one
# row after another: mlaserve_old). Kernels compile once (the graphs test) while the model
# is synthesized.
# On the build machine: cargo build --release -p mlaserve ...; LABS=0 tools/device/pack.sh
# <7c26b80's mlaserve>; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/sample.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; nproc; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
timeout 100 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1 &
timeout 150 $B/graphs --test-threads=1 > $OUT/graphs.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
echo "== synth done $(el)" >> $L
for v in mlaserve mlaserve_old; do
  $B/$v serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > $OUT/serve-$v.log 2>&1 &
  SP=$!
  for i in $(seq 1 90); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== $v ready $(el)" >> $L
  timeout 60 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 64 --temperature 0.8 --vocab-size 102400 \
    --out $OUT/serve-$v.json 2>&1 | grep -E "^concurrency" >> $L
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
