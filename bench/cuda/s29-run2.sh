#!/usr/bin/env bash
# Session 29, run 2: tokens drawn at a temperature on the device (logits_pick).
# 1. the pick op family (greedy and drawn rows, bit for bit against RowPick::of), graphs;
# 2. tg128 b1/b64/b256 greedy (argmax), drawn on the device (sample), whole logits (full);
# 3. serving sweeps at temperature 0.8: device draws, then MLASERVE_DEVICE_SAMPLING=0 (the
#    host draws from whole rows: the same-run baseline), then greedy (no regression).
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run2.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OPS=argmax timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "logits_pick|test result|past their bound" $OUT/tests.txt | head -30 >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "picked on the device|test result|FAILED|panicked" $OUT/tests.txt >> $L
wait
for m in argmax sample full; do
  timeout 150 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64,256 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /" >> $L
done
timeout 60 $B/decode_profile /tmp/v2-bf16t.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
for v in "0.8 1" "0.8 0" "0 1"; do
  set -- $v
  MLASERVE_DEVICE_SAMPLING=$2 $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > /dev/null 2>&1 &
  SP=$!
  for i in $(seq 1 150); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== sweep temperature $1 device sampling $2 $(el)" >> $L
  timeout 150 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 --temperature $1 \
    --vocab-size 102400 --out $OUT/serve-t$1-d$2.json 2>&1 | grep -E "^concurrency" >> $L
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" 2>&1 | grep -E "^mlaserve:engine_step_(forward|host)" >> $L
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
