#!/usr/bin/env bash
# The next session's first device run, prepared in session 27 (no device time left for it):
# 1. the landed build whole: op table, e2e, graphs, bf16 b1 replays (item 2);
# 2. the serving sweep on it, greedy and at temperature 0.8 (item 3; session 27 ran the
#    parallel sampling at 64 only), /metrics after each;
# 3. decode_profile --forward at 64 and 256 rows: the whole step against its graph (the
#    host's part after the kept logits buffer: ~2 ms at 64 rows in session 27, nearly all of
#    it the logits' pageable copy at ~14 GB/s — page-locked would be ~0.5 ms).
# On the build machine: cargo build ... && LABS=0 tools/device/pack.sh; pip download
# httpx==0.28.1 -d .device/wheels --only-binary=:all:; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
(timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 240 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "test result|FAIL" $OUT/tests.txt >> $L
timeout 100 $B/e2e --test-threads=2 --nocapture >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
timeout 60 $B/decode_profile /tmp/v2-bf16t.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
for b in 64 256; do
  timeout 90 $B/decode_profile /tmp/v2-bf16t.gguf --batch $b --ctx 64 --forward 30 --replays 50 2>&1 | grep -E "median|MB of|rror" >> $L
done
for t in 0 0.8; do
  $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > $OUT/serve-t$t.log 2>&1 &
  SP=$!
  for i in $(seq 1 120); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== sweep temperature $t $(el)" >> $L
  timeout 150 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 --temperature $t \
    --vocab-size 102400 --out $OUT/serve-t$t.json 2>&1 | grep -E "^concurrency" >> $L
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" > $OUT/metrics-t$t.txt 2>&1
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
