#!/usr/bin/env bash
# Live-server tests: build the server, start it on a free port with a fixture model, run pytest
# (the official `openai` client) against it, then stop it with SIGTERM and require a graceful
# exit (status 0).
#
#   tests/server/run.sh [pytest args...]
#
# Environment:
#   MLASERVE_TEST_MODEL   model file (default: the tiny DeepSeek-V2 fixture, F32 GGUF)
#   MLASERVE_TEST_VENV    venv for requirements.txt (default: target/server-test-venv; created once)
#   MLASERVE_SERVER       cli | example | auto (default auto: `mlaserve serve` if the CLI has it,
#                         else the server crate's `serve` example)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
MODEL=${MLASERVE_TEST_MODEL:-$ROOT/tests/fixtures/models/deepseek_v2/deepseek_v2-f32.gguf}
VENV=${MLASERVE_TEST_VENV:-$ROOT/target/server-test-venv}
KIND=${MLASERVE_SERVER:-auto}
LOG=$ROOT/target/server-test.log

if [ ! -x "$VENV/bin/pytest" ] || ! "$VENV/bin/python" -c "import openai, httpx" 2>/dev/null; then
    echo "run.sh: installing tests/server/requirements.txt into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r tests/server/requirements.txt
fi

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if [ "$KIND" = auto ]; then
    if cargo build -q -p mlaserve 2>/dev/null && target/debug/mlaserve serve --help >/dev/null 2>&1; then
        KIND=cli
    else
        KIND=example
    fi
fi
case "$KIND" in
    cli)
        cargo build -q -p mlaserve
        CMD=(target/debug/mlaserve serve --model "$MODEL" --host 127.0.0.1 --port "$PORT") ;;
    example)
        cargo build -q -p mlaserve-server --example serve
        CMD=(target/debug/examples/serve --model "$MODEL" --host 127.0.0.1 --port "$PORT"
             --served-model-name tiny --cache-mb 64 --block-size 16) ;;
    *) echo "run.sh: MLASERVE_SERVER must be cli, example or auto" >&2; exit 2 ;;
esac

echo "run.sh: starting ${CMD[*]} (log: $LOG)"
"${CMD[@]}" >"$LOG" 2>&1 &
SERVER_PID=$!
cleanup() {
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

BASE="http://127.0.0.1:$PORT"
health() {
    python3 -c 'import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).status)
except Exception as e:
    print(getattr(e, "code", 0))' "$BASE"
}
for _ in $(seq 1 600); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "run.sh: the server exited during start-up:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    if [ "$(health)" = 200 ]; then break; fi
    sleep 0.2
done
if [ "$(health)" != 200 ]; then
    echo "run.sh: the server did not become healthy in 120 s" >&2
    cat "$LOG" >&2
    exit 1
fi

set +e
MLASERVE_BASE_URL=$BASE "$VENV/bin/pytest" -q tests/server "$@"
STATUS=$?
set -e

kill -TERM "$SERVER_PID"
set +e
wait "$SERVER_PID"
EXIT=$?
set -e
if [ "$EXIT" -ne 0 ]; then
    echo "run.sh: the server exited with status $EXIT after SIGTERM (expected a graceful 0)" >&2
    tail -n 50 "$LOG" >&2
    [ "$STATUS" -eq 0 ] && STATUS=1
else
    echo "run.sh: the server shut down gracefully on SIGTERM"
fi
exit "$STATUS"
