#!/usr/bin/env bash
# The project's test command (README, .ci/run): every Rust test of the workspace, then the
# live-server tests with the official `openai` client (tests/server/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast
else
    cargo test --workspace --no-fail-fast
fi
tests/server/run.sh
