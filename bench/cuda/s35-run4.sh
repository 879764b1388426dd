#!/usr/bin/env bash
# Session 35, run 4: the one-token steps' cluster attention (mla_attn_cl) end to end through
# the executor, GPU against CPU, on synthetic models with the real 512 + 64 latent row (no
# fixture reaches it: their latent rows are 64 + 16): tools/check_gpu_synth.py's new paths —
# `decode` (one token a step: V2-Lite's 16 heads take mla_attn_cl by the default rule; the
# 64-head models the three launches) and `decode-cl` (MLASERVE_CLUSTER_ATTN=all: every
# one-token step of a dense-list layer on mla_attn_cl; DSA layers stay on the three launches:
# the executor moves the row's finish into the attention only over dense key lists).
# Build machine: mlaserve and synth_model of 88ec61d (f77305b's kernels), stripped, in
#   .device/pkg/bins.tar.xz; cp this .device/next.sh
set -u
mkdir -p .device/bin && tar -xJf .device/pkg/bins.tar.xz -C .device/bin
B=$PWD/.device/bin; export MLASERVE_KERNEL_CACHE=/tmp/kc; L=$OUT/run4.txt
S=$(date +%s); el() { echo "$(( $(date +%s) - S ))s"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } >> $L
C="python3 tools/check_gpu_synth.py --mlaserve $B/mlaserve --synth $B/synth_model --dir /tmp/synth"
timeout 150 $C --models l512-tiny,l512-tiny-dsa --paths decode-cl,decode >> $L 2>&1; echo "l512 rc=$? $(el)" >> $L
timeout 120 $C --models v2-lite --paths decode >> $L 2>&1; echo "v2-lite rc=$? $(el)" >> $L
cat $L
