#!/usr/bin/env bash
# Session 27, runs 4-5: the logits' way to the host. Run 3 measured the whole tg128 step at 64
# rows (mlaserve bench, 19.2 ms) 7 ms longer than its graph's replay at the same context
# (12.0 ms), and a 26 MB copy to fresh pageable memory at 2.1 ms against 0.5 ms pinned. Now:
# Executor::forward_into with one kept buffer (the engine recycles it), the copy through a
# page-locked staging buffer (Gpu::read_f32_into; run 5: straight into the kept buffer, which
# run 4 measured faster than staging then copying). Measured: decode_profile --forward (whole
# steps, fresh or kept logits; the copy four ways) against --replays; mlaserve bench old
# (mlaserve_old: the build before) and new; the serving sweep on the new build.
# On the build machine: cargo build ...; cp <old mlaserve> /tmp/mlaserve_old;
# LABS=0 tools/device/pack.sh /tmp/mlaserve_old; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/logits.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
[ -e /tmp/v2-bf16t.gguf ] || timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1
echo "== synth done $(el)" >> $L
# the forward path changed (the logits' copy): e2e and graph tests (GPU against the CPU)
timeout 200 $B/e2e --test-threads=2 > $OUT/tests.txt 2>&1; echo "e2e rc=$? $(el)" >> $L
timeout 60 $B/graphs --test-threads=1 >> $OUT/tests.txt 2>&1; echo "graphs rc=$? $(el)" >> $L
grep -E "test result|FAIL|panicked" $OUT/tests.txt >> $L
for b in 64 16; do
  echo "== decode_profile b$b ctx 64 $(el)" >> $L
  timeout 120 $B/decode_profile /tmp/v2-bf16t.gguf --batch $b --ctx 64 --forward 30 --replays 50 2>&1 | grep -E "median|MB of|rror" >> $L
done
for r in 1; do for v in mlaserve_old mlaserve; do
  echo "== bench $v round $r $(el)" >> $L
  timeout 150 $B/$v bench --model /tmp/v2-bf16t.gguf --device cuda -p 512 -n 128 -b 1,16,64,256 -r 3 2>&1 | grep -E "^\|.*(pp|tg)" >> $L
done; done
$B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 \
    > $OUT/serve-log.txt 2>&1 &
SP=$!
for i in $(seq 1 240); do
  python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
  sleep 1
done
echo "== server ready $(el)" >> $L
timeout 200 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
  --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 --vocab-size 102400 \
  --out $OUT/serve_v2lite.json >> $L 2>&1
echo "== sweep rc=$? $(el)" >> $L
python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" > $OUT/metrics.txt 2>&1
kill $SP; wait $SP 2>/dev/null
echo "end $(el)" >> $L
cat $L
