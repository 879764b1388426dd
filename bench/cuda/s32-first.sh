#!/usr/bin/env bash
# Prepared in session 31 for the next session's first device run: what costs ~160 µs a radix
# pass in logits_pick's filtered draw (v2lite.md, session 31, run 5), when a plain summing
# pass costs ~15. The logits_pick lab under five builds of the
# kernels: as landed, without the histogram atomics (-DPICK_LAB_NO_ATOMICS: the pass's loads
# and tests kept, picks WRONG), without the warp aggregation (-DPICK_LAB_NO_MATCH: an atomic
# a lane), without the selects at all (-DPICK_LAB_NO_RADIX: the draw's other passes), and
# with the bins in 4 copies, a copy per 8 warps (-DPICK_LAB_GROUPS=4: a candidate fix if the
# atomics are the cost; its picks are checked by the lab; landing it needs the op table).
# The variants compile side by side first (--warm), then run one at a time.
# First, the pick family of the op table with session 31's new random-filters case (not yet
# run on a GPU; every row must match).
#   cargo build --release -p mlaserve-cuda --example logits_pick && cargo test --release -p mlaserve-cuda --no-run
#   rm -rf .device/pkg /tmp/pk && mkdir -p .device/pkg /tmp/pk && cp target/release/examples/logits_pick /tmp/pk/ \
#     && cp "$(ls -t target/release/deps/ops-* | grep -v '\.d$' | head -1)" /tmp/pk/ops && strip /tmp/pk/* \
#     && (cd /tmp/pk && XZ_OPT=-9e tar -cJf "$OLDPWD/.device/pkg/bins.tar.xz" logits_pick ops)
#   cp bench/cuda/s32-first.sh .device/next.sh; run `bash .device/next.sh` with carry [".device"]
#   (~2 MB; the carry limit counts the tracked tree too). ~6 minutes.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
V=("" "-DPICK_LAB_NO_ATOMICS" "-DPICK_LAB_NO_MATCH" "-DPICK_LAB_NO_RADIX" "-DPICK_LAB_GROUPS=4")
for d in "${V[@]}"; do MLASERVE_KERNEL_DEFINES="$d" timeout 300 $B/logits_pick --warm & done
wait; echo "== compiled $(el)" >> $L
MLASERVE_OPS=argmax timeout 200 $B/ops --test-threads=1 --nocapture > $OUT/tests.txt 2>&1; echo "ops rc=$? $(el)" >> $L
grep -E "logits_pick|test result|past their bound|panicked" $OUT/tests.txt | head -40 >> $L
for d in "${V[@]}"; do
  echo "== defines: '${d}' $(el)" >> $L
  MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/logits_pick >> $L 2>&1
done
echo "end $(el)" >> $L
cat $L
