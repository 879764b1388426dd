#!/usr/bin/env bash
# Session 33, run 4: the landed build whole — op table (ops-report.json) and graph tests (e2e
# left out: its binary and the wheels passed the carry limit) —
# then serving at temperature 0.8, top-p 0.95 (bench/serving/bench_serving.py, 128 prompt / 64
# output tokens, concurrency 1-16) against `mlaserve serve --device cuda` on the bf16
# V2-Lite-shaped model with the picks split over clusters (default) and a block a row
# (MLASERVE_PICK_CLUSTER=1), one server after the other.
# Build machine: cargo build --release -p mlaserve && cargo build --release -p mlaserve-cuda
#   --examples && cargo build --release -p mlaserve-model --example synth_model && cargo test
#   --release -p mlaserve-cuda --no-run; LABS=0 tools/device/pack.sh;
#   pip download httpx==0.28.1 -d .device/wheels --only-binary=:all:; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run4.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 200 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
echo "e2e: not carried (the carry limit)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "test result|FAILED|panicked|rows,|failing" $OUT/tests.txt | head -20 >> $L
wait
for c in auto 1; do
  ( [ $c = auto ] || export MLASERVE_PICK_CLUSTER=$c
    exec $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > $OUT/serve-log-$c.txt 2>&1 ) &
  SP=$!
  for i in $(seq 1 200); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== server ($c) ready $(el)" >> $L
  timeout 150 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16 --vocab-size 102400 \
    --temperature 0.8 --top-p 0.95 --out $OUT/serve-$c.json > $OUT/serve-stdout-$c.txt 2>&1
  echo "== sweep ($c) rc=$? $(el)" >> $L
  grep -E "^\||concurrency" $OUT/serve-stdout-$c.txt | head -12 >> $L
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
