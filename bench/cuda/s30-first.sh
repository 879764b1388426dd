#!/usr/bin/env bash
# The next session's first device run, prepared in session 29 (whose device machine was no
# longer lent when this was to run): draws with top-k / top-p / min-p on the GPU
# (`pick_filtered` in elementwise.cu), which exists only as bench/cuda/pick-filtered-s29.patch:
#   git apply bench/cuda/pick-filtered-s29.patch, build, LABS=0 tools/device/pack.sh,
#   cp this .device/next.sh, run with carry [".device"].
# 1. the whole op table (the pick family: greedy, drawn, drawn with filters, bit for bit
#    against RowPick::of), e2e, graphs (filtered draws in graphed steps);
# 2. tg128 b1/b64/b256: sampled (no filter), sampled with top-k 50 + top-p 0.95, full logits;
#    Also graphs with MLASERVE_PICK_WHOLE_ROWS=1 (steps mixing picked rows with rows handed
#    back whole: deliver's copies of those rows, session 29's, not yet run); if it passes,
#    make that the default (executor.rs pick_whole_rows).
# 3. serving at temperature 0.8, top-p 0.95: draws on the GPU, then MLASERVE_DEVICE_SAMPLING=0;
#    then top-p 1 (session 29's serving figures at 0.8 came from the draw's first kernel).
# $OUT: first.txt, tests.txt, ops-report.json, three sweep reports (the device returns 8 files).
# Land the patch only if every pick row matches; else keep the host fallback (4b635f0).
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 300 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "logits_pick|test result|past their bound" $OUT/tests.txt | head -40 >> $L
timeout 100 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 --nocapture >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
# rows handed back whole beside device picks: deliver's row copies (session 29, not yet run)
MLASERVE_PICK_WHOLE_ROWS=1 timeout 60 $B/graphs --test-threads=1 --nocapture device_picks >> $OUT/tests.txt 2>&1; echo "graphs whole rows rc=$? $(el)" >> $L
grep -E "picked on the device|test result|FAILED|panicked" $OUT/tests.txt >> $L
wait
for m in sample sample-filtered full; do
  timeout 120 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 0 -n 128 -b 1,64,256 -r 3 --tg-logits $m 2>&1 | grep -E "^\| /|rror" >> $L
done
for v in "1 0.95" "0 0.95" "1 1"; do
  set -- $v; d=$1; tp=$2
  MLASERVE_DEVICE_SAMPLING=$d $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > $OUT/serve-$d.log 2>&1 &
  SP=$!
  for i in $(seq 1 150); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== sweep temperature 0.8 top-p $tp device sampling $d $(el)" >> $L
  timeout 200 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 --temperature 0.8 --top-p $tp \
    --vocab-size 102400 --out $OUT/serve-p$tp-d$d.json 2>&1 | grep -E "^concurrency" >> $L
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" 2>&1 | grep -E "^mlaserve:engine_step_(forward|host)" >> $L
  kill $SP; wait $SP 2>/dev/null
  tail -3 $OUT/serve-$d.log | grep -iE "error|panic" >> $L
done
rm -f $OUT/serve-*.log
echo "end $(el)" >> $L
cat $L
