#!/usr/bin/env bash
# SmolLM2-135M-Instruct's GGUF (scripts/fetch-test-model.sh) served and chatted with:
#   - `loom serve --model FILE.gguf` and the official `openai` client: /v1/models names the
#     model, a greedy chat answer (plain and streamed) is "The capital of France is Paris."
#     through the model's own template, ends with finish_reason "stop" at the model's end
#     token, and shows no special token; a completion request works too;
#   - `loom chat --model FILE.gguf` fed on standard input: the same answer, /reset, /exit.
# Skips (exit 77, "SKIPPED:") only when the model or the client cannot be downloaded.
# usage: smollm2_serve_test.sh LOOM_BINARY SOURCE_DIR BUILD_DIR
set -u
LOOM="$1"
SRC="$2"
BUILD="$3"
WORK="$(mktemp -d)"
SERVER=""
cleanup() {
  [ -n "$SERVER" ] && { kill -KILL "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; }
  rm -rf "$WORK"
}
trap cleanup EXIT
skip() { echo "SKIPPED: $*"; exit 77; }

MODEL="$(bash "$SRC/scripts/fetch-test-model.sh" 2>"$WORK/fetch.log")"
rc=$?
[ $rc -eq 3 ] && skip "$(tail -n 1 "$WORK/fetch.log")"
[ $rc -eq 0 ] || { cat "$WORK/fetch.log"; exit 1; }

# loom chat, scripted through a pipe.
printf 'What is the capital of France?\n/reset\n/nonsense\n/exit\n' |
  "$LOOM" chat --model "$MODEL" --temperature 0 --max-tokens 24 > "$WORK/chat.txt" 2> "$WORK/chat.log"
rc=$?
cat "$WORK/chat.log"
cat "$WORK/chat.txt"
[ $rc -eq 0 ] || { echo "loom chat exited with $rc"; exit 1; }
grep -qx "The capital of France is Paris." "$WORK/chat.txt" || { echo "loom chat: wrong answer"; exit 1; }
grep -q "the conversation starts over" "$WORK/chat.txt" || { echo "loom chat: /reset not acknowledged"; exit 1; }
grep -q "unknown command /nonsense" "$WORK/chat.txt" || { echo "loom chat: unknown command not reported"; exit 1; }

VENV="$BUILD/openai-venv"
command -v python3 >/dev/null || skip "python3 is not installed"
if ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
  timeout 120 "$VENV/bin/pip" install -q --disable-pip-version-check openai >/dev/null 2>&1 ||
    { rm -rf "$VENV"; skip "pip install openai failed (no network access?)"; }
fi

LOG="$WORK/server.log"
"$LOOM" serve --model "$MODEL" --port 0 --threads 2 --kv-cache-mb 512 --shutdown-grace 2 >"$LOG" 2>&1 &
SERVER=$!
PORT=""
for _ in $(seq 1 300); do
  PORT="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)"
  [ -n "$PORT" ] && break
  kill -0 "$SERVER" 2>/dev/null || { echo "loom serve exited early:"; cat "$LOG"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "loom serve did not report its port:"; cat "$LOG"; exit 1; }

"$VENV/bin/python" - "$PORT" "$(basename "$MODEL" .gguf)" <<'PY'
import sys, time, urllib.request
from openai import OpenAI

port, name = sys.argv[1], sys.argv[2]
for _ in range(600):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
            break
    except Exception:
        pass
    time.sleep(0.1)
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
ids = [m.id for m in client.models.list().data]
assert ids == [name], f"/v1/models lists {ids}, expected [{name!r}]"
question = [{"role": "user", "content": "What is the capital of France?"}]
want = "The capital of France is Paris."
r = client.chat.completions.create(model=name, messages=question, temperature=0, max_tokens=32)
got = r.choices[0].message.content
assert got == want, f"chat answer {got!r}, expected {want!r}"
assert r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason!r}"
assert r.usage.prompt_tokens == 37, f"prompt_tokens {r.usage.prompt_tokens}, expected 37 (the template's prompt)"
streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model=name, messages=question, temperature=0, max_tokens=32, stream=True) if c.choices)
assert streamed == want, f"streamed answer {streamed!r}, expected {want!r}"
c = client.completions.create(model=name, prompt="The capital of France is", temperature=0, max_tokens=3)
assert c.choices[0].text.strip(), "empty completion"
assert "<|" not in got + streamed + c.choices[0].text, "a special token leaked into the text"
print(f"[openai client] /v1/models {ids}; chat {got!r} (finish {r.choices[0].finish_reason}, "
      f"{r.usage.prompt_tokens} prompt tokens); streamed equal; completion {c.choices[0].text!r}")
PY
RC=$?
[ $RC -eq 0 ] || { echo "server log:"; cat "$LOG"; }
kill -TERM "$SERVER"
wait "$SERVER"
SERVER_RC=$?
SERVER=""
[ "$SERVER_RC" -eq 0 ] || { echo "loom serve exited with $SERVER_RC after SIGTERM:"; cat "$LOG"; exit 1; }
exit $RC
