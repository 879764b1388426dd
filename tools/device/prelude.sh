# Sourced (`. tools/device/prelude.sh`) by the bench/cuda/sNN-*.sh device scripts, from the
# repository root on the device machine, with RUN naming the run: unpacks the carried
# binaries (.device/pkg/bins.tar.xz, packed by hand or by pack.sh) into $B, links /work/main
# (the fixtures' recorded paths), keeps NVRTC's kernels in /tmp/kc, and starts the run's log
# $L = $OUT/$RUN.txt with the card, driver, clock and date; `el` prints seconds since.
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=$PWD/.device/bin
export MLASERVE_KERNEL_CACHE=/tmp/kc
L=$OUT/${RUN:-run}.txt
S=$(date +%s)
el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; date -u; } >> "$L"
