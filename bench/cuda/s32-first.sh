#!/usr/bin/env bash
# Prepared in session 31 for the next session's first device run: what costs ~160 µs a radix
# pass in logits_pick's filtered draw (v2lite.md, session 31, run 5), when a plain summing
# pass costs ~15. The logits_pick lab (pack.sh with its labs) under four builds of the
# kernels: as landed, without the histogram atomics (-DPICK_LAB_NO_ATOMICS: the pass's loads
# and tests kept, picks WRONG), without the warp aggregation (-DPICK_LAB_NO_MATCH: an atomic
# a lane), without the selects at all (-DPICK_LAB_NO_RADIX: the draw's other passes), and
# with the bins in 4 copies, a copy per 8 warps (-DPICK_LAB_GROUPS=4: a candidate fix if the
# atomics are the cost; its picks are checked by the lab; landing it needs the op table).
# The variants compile side by side first (--warm), then run one at a time.
#   cargo build --release -p mlaserve-cuda --example logits_pick
#   rm -rf .device/pkg && mkdir -p .device/pkg /tmp/pk && cp target/release/examples/logits_pick /tmp/pk/ \
#     && strip /tmp/pk/logits_pick && (cd /tmp/pk && XZ_OPT=-9e tar -cJf "$OLDPWD/.device/pkg/bins.tar.xz" logits_pick)
#   cp bench/cuda/s32-first.sh .device/next.sh; run `bash .device/next.sh` with carry [".device"]
#   (the lab alone is ~0.4 MB; the carry limit counts the tracked tree too). ~4 minutes.
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/first.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
V=("" "-DPICK_LAB_NO_ATOMICS" "-DPICK_LAB_NO_MATCH" "-DPICK_LAB_NO_RADIX" "-DPICK_LAB_GROUPS=4")
for d in "${V[@]}"; do MLASERVE_KERNEL_DEFINES="$d" timeout 300 $B/logits_pick --warm & done
wait; echo "== compiled $(el)" >> $L
for d in "${V[@]}"; do
  echo "== defines: '${d}' $(el)" >> $L
  MLASERVE_KERNEL_DEFINES="$d" timeout 120 $B/logits_pick >> $L 2>&1
done
echo "end $(el)" >> $L
cat $L
