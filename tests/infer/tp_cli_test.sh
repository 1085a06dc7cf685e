#!/usr/bin/env bash
# Tensor-parallel inference through the CLI: train a tiny byte-level model (6 heads), then
# `loom launch --nproc 2 -- generate --tp 2` prints exactly what `loom generate` prints
# (greedy and sampled, and greedy with n-gram speculation), --tp 3 too; `serve --tp 2`
# answers a completion with the same text and stops cleanly on SIGTERM; `bench infer --tp 2`
# reports decode speed; a tp that does not divide the heads, and --tp without the processes
# it needs, are refused naming the fix.
set -euo pipefail
LOOM="$1"
SRC="$2"
WORK="$(mktemp -d)"
SERVER=""
cleanup() {
  [ -n "$SERVER" ] && kill -TERM "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1
source "$SRC/tests/infer/cli_helpers.sh"
tiny_data
train_tiny run
train_tiny draft --set model.n_layer=1 --set model.d_model=64 --set model.n_head=2 --set model.d_ff=256

gen() { "$LOOM" generate --checkpoint "$WORK/run" --prompt "ROMEO: O Romeo" --max-tokens 48 "$@" 2>/dev/null; }
tpgen() { local n="$1"; shift; "$LOOM" launch --nproc "$n" -- generate --checkpoint "$WORK/run" --prompt "ROMEO: O Romeo" \
  --max-tokens 48 --tp "$n" "$@" 2>"$WORK/tp.err"; }
for args in "--temperature 0" "--temperature 0.9 --seed 7"; do
  want="$(gen $args)"
  got="$(tpgen 2 $args)"
  [ "$got" = "$want" ] || { echo "tp=2 ($args) printed something else:"; echo "$want"; echo "$got"; cat "$WORK/tp.err"; exit 1; }
done
want="$(gen --temperature 0)"
got="$(tpgen 3 --temperature 0)"
[ "$got" = "$want" ] || { echo "tp=3 greedy differs:"; echo "$want"; echo "$got"; exit 1; }
got="$(tpgen 2 --temperature 0 --speculative ngram,k=4)"
[ "$got" = "$want" ] || { echo "tp=2 with n-gram speculation differs:"; echo "$want"; echo "$got"; exit 1; }
grep -q "tensor-parallel over 2 ranks" "$WORK/tp.err" || { echo "no tp line:"; cat "$WORK/tp.err"; exit 1; }
# A draft model: rank 0's proposals are broadcast, so even sampled speculative outputs equal
# one process's with the same draft.
for args in "--temperature 0" "--temperature 0.9 --seed 3"; do
  want_spec="$(gen $args --speculative "draft=$WORK/draft")"
  got="$(tpgen 2 $args --speculative "draft=$WORK/draft")"
  [ "$got" = "$want_spec" ] || { echo "tp=2 with a draft ($args) differs:"; echo "$want_spec"; echo "$got"; exit 1; }
done

# serve --tp 2 on a free port: the completion's text equals generate's continuation.
"$LOOM" launch --nproc 2 -- serve --checkpoint "$WORK/run" --port 0 --tp 2 --threads 1 --kv-cache-mb 4 \
  > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVER=$!
for _ in $(seq 1 100); do grep -q "ready:" "$WORK/serve.out" 2>/dev/null && break; sleep 0.2; done
grep -q "tensor-parallel over 2 ranks" "$WORK/serve.out" || { echo "serve --tp 2 not ready:"; cat "$WORK/serve.out" "$WORK/serve.err"; exit 1; }
port="$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/serve.out")"
text="$(python3 - "$port" <<'PY'
import json, sys, urllib.request
body = {"model": "gpt2-shakespeare", "prompt": "ROMEO: O Romeo", "max_tokens": 48, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
print(json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"], end="")
PY
)"
[ "ROMEO: O Romeo$text" = "$want" ] || { echo "serve --tp 2 answered something else:"; echo "$want"; echo "ROMEO: O Romeo$text"; exit 1; }
# SIGTERM to rank 0 (as a process manager stops a server): it stops, releases rank 1, and the
# job ends with status 0.
rank0=""
for pid in $(pgrep -f "serve --checkpoint $WORK/run"); do
  tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && rank0="$pid"
done
[ -n "$rank0" ] || { echo "rank 0 of serve --tp 2 not found"; exit 1; }
kill -TERM "$rank0"
rc=0
wait "$SERVER" || rc=$?
SERVER=""
[ "$rc" = 0 ] || { echo "serve --tp 2 exited $rc on SIGTERM:"; cat "$WORK/serve.out" "$WORK/serve.err"; exit 1; }
grep -q "stopped: 1 requests finished" "$WORK/serve.out" || { echo "serve did not stop cleanly:"; cat "$WORK/serve.out"; exit 1; }

out="$("$LOOM" launch --nproc 2 -- bench infer --tp 2 --checkpoint "$WORK/run" --batch1-tokens 12 --prefill-tokens 32 2>/dev/null)"
echo "$out" | grep -q '^SUMMARY .*"tp":2,.*"batch1_tokens_per_s".*"prefill_tokens_per_s"' || { echo "bench infer --tp 2:"; echo "$out"; exit 1; }

refused "[config] --tp=4 does not divide model.n_head=6" "$LOOM" launch --nproc 4 -- generate --checkpoint "$WORK/run" \
  --prompt "A" --tp 4
refused "--tp 2 needs 2 processes, one per slice, but 1 is running; start it as loom launch --nproc 2" \
  "$LOOM" generate --checkpoint "$WORK/run" --prompt "A" --tp 2
echo "tensor-parallel inference CLI: ok"
