#!/usr/bin/env bash
# The next session's first device run, prepared in session 28 (its device time ran out after
# run 6): the landed build whole — session 28's last commit (moe_gemm_wg2_glu and the copies
# after the wgmmas made the default, the #ifdefs removed) never ran without the lab defines.
# 1. whole op table (replaces ops-report.json), e2e, graphs;
# 2. the prefill steps (11 x 128, 1 x 2048) whole and by kernel, MLASERVE_MOE_GLU=0 / default;
# 3. bf16 b1 replays (item 2), tg128 b1/b64/b256 (argmax), pp512;
# 4. the serving sweep (greedy and temperature 0.8) with /metrics — keep $OUT to <= 8 files.
# On the build machine: cargo build ... && LABS=0 tools/device/pack.sh; pip download
# httpx==0.28.1 -d .device/wheels --only-binary=:all:; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
( timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1; echo "== synth $(el)" >> $L ) &
MLASERVE_OP_REPORT=$OUT/ops-report.json timeout 300 $B/ops --test-threads=1 > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "test result|past their bound" $OUT/tests.txt >> $L
timeout 100 $B/e2e --test-threads=2 >> $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
wait
for g in 0 1; do
  for spec in "11 128" "1 2048"; do
    set -- $spec
    echo "== prefill $1 x $2, MLASERVE_MOE_GLU=$g $(el)" >> $L
    MLASERVE_MOE_GLU=$g timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch $1 --prefill $2 --ctx 0 > $OUT/p.txt 2>&1
    grep -E "prefill step|moe_gemm|silu_mul|rror" $OUT/p.txt | head -4 >> $L
  done
done
rm -f $OUT/p.txt
timeout 60 $B/decode_profile /tmp/v2-bf16t.gguf --batch 1 --replays 300 2>&1 | grep -E "median|rror" >> $L
timeout 150 $B/mlaserve bench --model /tmp/v2-bf16t.gguf --device cuda -p 512 -n 128 -b 1,64,256 -r 3 2>&1 | grep -E "^\|" >> $L
for t in 0 0.8; do
  $B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 > /dev/null 2>&1 &
  SP=$!
  for i in $(seq 1 150); do
    python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
    sleep 1
  done
  echo "== sweep temperature $t $(el)" >> $L
  timeout 150 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
    --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 --temperature $t \
    --vocab-size 102400 --out $OUT/serve-t$t.json 2>&1 | grep -E "^concurrency" >> $L
  python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" 2>&1 | grep -E "^mlaserve:engine_step" >> $L
  kill $SP; wait $SP 2>/dev/null
done
echo "end $(el)" >> $L
cat $L
