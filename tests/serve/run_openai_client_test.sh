#!/usr/bin/env bash
# ctest driver for openai_client_test.py: makes a private virtual environment under the build
# directory, installs the official `openai` client into it (skips with exit 77 and a
# "SKIPPED:" line when Python, venv or the package index is missing; any other pip failure
# fails), starts `loom serve` on a
# free loopback port, runs the client checks, and always stops the server.
# usage: run_openai_client_test.sh LOOM_BINARY BUILD_DIR
set -u
LOOM="$1"
BUILD="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="$BUILD/openai-venv"
LOG="$BUILD/openai-client-server.log"

skip() { echo "SKIPPED: the official openai client against loom serve was not tested: $*"; exit 77; }

command -v python3 >/dev/null || skip "python3 is not installed"
if ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
  PIP_LOG="$BUILD/openai-pip.log"
  rc=0
  timeout 50 "$VENV/bin/pip" install -q --disable-pip-version-check openai >"$PIP_LOG" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    rm -rf "$VENV"
    [ "$rc" -ne 124 ] || skip "pip install openai took over 50 s (a slow or unreachable package index)"
    # Only an unreachable package index is a skip; any other pip failure (a broken venv, a
    # dependency that does not build) is this machine's to fix, and fails.
    if grep -qiE 'connection|resolve|network|timed out|No matching distribution|Could not find a version' "$PIP_LOG"; then
      skip "the package index is unreachable ($(grep -iE 'connection|resolve|network|timed out|No matching|Could not find' "$PIP_LOG" | tail -n 1))"
    fi
    echo "pip install openai failed, and not for want of the network:"; tail -n 20 "$PIP_LOG"; exit 1
  fi
fi

# One running sequence and no queue, so the client can provoke a 429; a longer context so a
# long request lasts long enough for that.
"$LOOM" serve --model gpt2-shakespeare --n-ctx 1024 --seed 1 --port 0 --api-key test-key \
  --served-model-name loom-test --max-num-seqs 1 --max-queue 0 --kv-cache-mb 16 --threads 1 \
  --shutdown-grace 2 >"$LOG" 2>&1 &
SERVER=$!
cleanup() { kill -KILL "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; }
trap cleanup EXIT

PORT=""
for _ in $(seq 1 300); do
  PORT="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)"
  [ -n "$PORT" ] && break
  kill -0 "$SERVER" 2>/dev/null || { echo "loom serve exited early:"; cat "$LOG"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "loom serve did not report its port:"; cat "$LOG"; exit 1; }
"$VENV/bin/python" - "$PORT" <<'PY' || { echo "loom serve never became ready:"; cat "$LOG"; exit 1; }
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
for _ in range(300):
    try:
        if urllib.request.urlopen(url, timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
PY

"$VENV/bin/python" "$HERE/openai_client_test.py" --base-url "http://127.0.0.1:$PORT/v1" --api-key test-key \
  --model loom-test
RC=$?

kill -TERM "$SERVER"
wait "$SERVER"
SERVER_RC=$?
trap - EXIT
if [ "$SERVER_RC" -ne 0 ]; then
  echo "loom serve exited with $SERVER_RC after SIGTERM:"
  cat "$LOG"
  exit 1
fi
echo "loom serve stopped cleanly on SIGTERM"
exit $RC
