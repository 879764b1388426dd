#!/usr/bin/env bash
# Session 27, runs 2-3: item 3 on the current build — `mlaserve bench` (llama-bench style pp512 /
# tg128 at 1-64 sequences) over the bf16 and Q4_K V2-Lite-shaped models, and the serving sweep
# (bench/serving/bench_serving.py, 128 prompt / 64 output tokens, concurrency 1-256, session 3's
# settings) against `mlaserve serve --device cuda` on the bf16 model, with /metrics after it.
# Run 3 adds: the tokenizer (run 2's model had none: every request 503 then the load failed),
# SIGTERM during a load, the GPU's step at tg's mean context, the logits' copy to the host.
# On the build machine: cargo build ... && tools/device/pack.sh; pip download httpx==0.28.1
# -d .device/wheels --only-binary=:all: (the GPU machine has no registry); cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/serve.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
python3 -c "import httpx" 2>/dev/null || pip install -q --no-index --find-links .device/wheels httpx >> $L 2>&1
python3 -c "import httpx; print('httpx', httpx.__version__)" >> $L 2>&1
# serve needs a tokenizer: the bundled model's, padded to the vocabulary (run 2 had none)
timeout 200 $B/synth_model v2-lite /tmp/v2-bf16t.gguf --tokenizer-from models/default.gguf > /dev/null 2>&1
echo "== synth bf16 done $(el)" >> $L
# the serving sweep first (the model in the page cache from its synthesis)
$B/mlaserve serve --model /tmp/v2-bf16t.gguf --device cuda --max-num-seqs 256 --port 8000 \
    > $OUT/serve-log.txt 2>&1 &
SP=$!
# SIGTERM while loading (its own empty kernel cache: ~90 s of NVRTC) must stop it at once
MLASERVE_KERNEL_CACHE=/tmp/kc-throwaway $B/mlaserve serve --model /tmp/v2-bf16t.gguf \
    --device cuda --port 8001 > $OUT/serve-term-log.txt 2>&1 &
TP=$!; sleep 8; t0=$(date +%s%N); kill -TERM $TP; wait $TP; trc=$?
echo "== SIGTERM 8 s into loading: rc=$trc, exited after $(( ($(date +%s%N) - t0) / 1000000 )) ms" >> $L
for i in $(seq 1 240); do
  python3 -c "import httpx; httpx.get('http://127.0.0.1:8000/health', timeout=2).raise_for_status()" 2>/dev/null && break
  sleep 1
done
echo "== server ready $(el)" >> $L
timeout 240 python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:8000 \
  --input-len 128 --output-len 64 --concurrency 1,4,16,64,256 --vocab-size 102400 \
  --out $OUT/serve_v2lite.json > $OUT/serve-stdout.txt 2>&1
echo "== sweep rc=$? $(el)" >> $L
python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8000/metrics').text)" > $OUT/metrics.txt 2>&1
kill $SP; wait $SP 2>/dev/null
python3 - >> $L <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/serve_v2lite.json"))
for r in d.get("levels", d.get("results", [])):
    print({k: r[k] for k in r if not isinstance(r[k], (dict, list))})
    for k in ("ttft_ms", "tpot_ms", "itl_ms"):
        if k in r: print("  ", k, r[k])
PY
# the GPU's part of a tg128 step (run 2: mlaserve bench, contexts 1-128) at its mean context
for b in 16 64; do
  echo "== decode_profile b$b ctx 64 $(el)" >> $L
  timeout 90 $B/decode_profile /tmp/v2-bf16t.gguf --batch $b --ctx 64 --replays 100 2>&1 | grep -E "median|rror" >> $L
done
# the logits' copy to the host at 64 rows x 102,400 f32 (26 MB): pageable and pinned
python3 - >> $L 2>&1 <<'PY'
import time, torch
d = torch.randn(64 * 102400, device="cuda"); torch.cuda.synchronize()
def t(f, n=20):
    v = []
    for _ in range(n):
        torch.cuda.synchronize(); s = time.perf_counter(); f(); torch.cuda.synchronize(); v.append(time.perf_counter() - s)
    v.sort(); return v[n // 2] * 1e3
pin = torch.empty(d.numel(), pin_memory=True)
print(f"26.2 MB to host: fresh pageable {t(lambda: d.cpu()):.2f} ms, pinned {t(lambda: pin.copy_(d)):.2f} ms")
PY
echo "end $(el)" >> $L
cat $L
