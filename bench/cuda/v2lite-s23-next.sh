#!/usr/bin/env bash
# The next session's first device run, prepared in session 22 (bench/cuda/v2lite.md): the
# cluster attention's exchanges as st.async pushes (MAC_PUSH: compiled, never run) and the
# merge on four lanes a column (MAC_MERGE4: -2.8 µs in run 3, its e2e and graph tests not run).
# On the build machine:
#   git apply bench/cuda/attn-next-s22.patch     # both variants behind #ifdef; default SASS unchanged
#   cargo build ... (tools/device/pack.sh lists the builds) && LABS=0 tools/device/pack.sh
#   cp bench/cuda/v2lite-s23-next.sh .device/next.sh
# On the device (carry .device): bash .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }   # the tests find fixtures there
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/ab.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
P="-DMAC_PUSH"; M="-DMAC_MERGE4"
# A define set's environment, then the command (MAC_PUSH's blocks need 101,480 bytes).
run_env() {
    local d=$1; shift
    if [[ $d == *MAC_PUSH* ]]; then
        env MLASERVE_KERNEL_DEFINES="$d" MLASERVE_ATTN_SMEM=101480 "$@"
    else
        env MLASERVE_KERNEL_DEFINES="$d" "$@"
    fi
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> $L
for d in "$P" "$M"; do
    run_env "$d" MLASERVE_OPS=attn_cluster timeout 100 $B/ops --test-threads=1 > $OUT/ops.txt 2>&1
    echo "ops [$d] rc=$? $(el)" >> $L
    run_env "$d" timeout 100 $B/e2e --test-threads=2 > $OUT/e2e.txt 2>&1
    echo "e2e [$d] rc=$? $(el)" >> $L
    run_env "$d" timeout 100 $B/graphs --test-threads=1 >> $OUT/e2e.txt 2>&1
    echo "graphs [$d] rc=$? $(el)" >> $L
done
timeout 60 $B/synth_model v2-lite /tmp/v2-bf16.gguf > /dev/null 2>&1; echo "synth $(el)" >> $L
r() { local d=$1; shift; echo "== [$d] $*: $(el)" >> $L
      run_env "$d" "$@" timeout 100 $B/decode_profile /tmp/v2-bf16.gguf --batch 1 --replays 300 >> $L 2>&1; }
for i in 1 2 3; do r ""; r "$P"; r "$M"; done
r "$P" MLASERVE_KERNEL_TRACE=1
echo "end $(el)" >> $L
grep -E "==|median|rc=|point|start to end|^end" $L
