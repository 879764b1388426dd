#!/usr/bin/env bash
# Package stripped binaries for the GPU machine (it has no Rust): the op/e2e/graphs test
# binaries, mlaserve, the decode_profile and qgemv labs and synth_model, into
# .device/pkg/bins.tar.xz (.device/ must be ignored: add it to .git/info/exclude). Carry
# `.device`; the carry limit (64 MiB) includes the tracked tree (59.6 MiB in session 45, when a
# 4.2 MiB archive beside it was refused), so keep the archive near 3 MiB: `LABS=0 SERVER=0`
# packs 2.6 MiB.
#
#   cargo build --release -p mlaserve && cargo build --release -p mlaserve-cuda --examples \
#     && cargo build --release -p mlaserve-model --example synth_model \
#     && cargo test --release -p mlaserve-cuda --no-run
#   tools/device/pack.sh [OLD_MLASERVE]    # OLD_MLASERVE: a baseline binary, as mlaserve_old
#   OLD_PROFILE=path tools/device/pack.sh  # a baseline decode_profile, as decode_profile_old
#                                          # (replays of two builds in one run); OLD_QGEMV
#                                          # the same for the qgemv lab; LABS=0 leaves
#                                          # out the qgemv, grid_barrier and logits_pick labs to
#                                          # make room; EXAMPLES="read_bw ..." adds those
#                                          # examples (bench/cuda/s44-next.sh: LABS=0
#                                          # EXAMPLES=read_bw); SERVER=0 leaves out
#                                          # mlaserve (scripts that only run tests and labs)
set -euo pipefail
cd "$(dirname "$0")/../.."
pkg=$(mktemp -d)
for b in ops e2e graphs; do
    f=$(ls -t target/release/deps/$b-* | grep -v '\.d$' | head -1)
    cp "$f" "$pkg/$b"
done
cp target/release/examples/{decode_profile,synth_model} "$pkg/"
if [ "${SERVER:-1}" != 0 ]; then cp target/release/mlaserve "$pkg/"; fi
if [ "${LABS:-1}" != 0 ]; then cp target/release/examples/{qgemv,grid_barrier,logits_pick} "$pkg/"; fi
for e in ${EXAMPLES:-}; do cp "target/release/examples/$e" "$pkg/"; done
if [ $# -ge 1 ]; then cp "$1" "$pkg/mlaserve_old"; fi
if [ -n "${OLD_PROFILE:-}" ]; then cp "$OLD_PROFILE" "$pkg/decode_profile_old"; fi
if [ -n "${OLD_QGEMV:-}" ]; then cp "$OLD_QGEMV" "$pkg/qgemv_old"; fi
strip "$pkg"/*
mkdir -p .device/pkg
(cd "$pkg" && XZ_OPT=-9e tar -cJf "$OLDPWD/.device/pkg/bins.tar.xz" ./*)
cp tools/device/decode_ab.sh .device/
rm -rf "$pkg"
ls -la .device/pkg/bins.tar.xz
