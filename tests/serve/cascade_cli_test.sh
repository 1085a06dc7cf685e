#!/usr/bin/env bash
# The edge/center cascade through the CLI, on tiny byte-level models: bad options refused
# naming the fix; an edge whose center is unreachable answers locally and says so, or answers
# 503 with --center-down fail; then `loom bench cascade --quick` (test hosts when root, else
# loopback) runs the sweep and a mid-run rollout with no failed request and no answer from a
# third version, and writes its CSV and SVG.
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
train_tiny center
small=(--set model.n_layer=1 --set model.d_model=64 --set model.n_head=2)
train_tiny small "${small[@]}" --set model.d_ff=128
train_tiny small2 "${small[@]}" --set model.d_ff=192
for m in small small2; do
  for q in int8 int4; do
    "$LOOM" quantize --checkpoint "$WORK/$m" --to $q --out "$WORK/$m-$q" > /dev/null
    echo "$m" > "$WORK/$m-$q/VERSION"
  done
done

refused "--confidence-threshold 1.5 is outside [0, 1]" \
  "$LOOM" serve --checkpoint "$WORK/small-int8" --role edge --center http://127.0.0.1:9 --confidence-threshold 1.5
refused "--role edge needs --center URL" "$LOOM" serve --checkpoint "$WORK/small-int8" --role edge
refused "--center applies to --role edge only" "$LOOM" serve --checkpoint "$WORK/center" --center http://127.0.0.1:9
refused "expected VARIANT=DIR" "$LOOM" serve --checkpoint "$WORK/center" --role center --edge-models "$WORK/small-int8"
refused "--role hub: expected center or edge" "$LOOM" serve --checkpoint "$WORK/center" --role hub
refused "each must be a number in [0, 1]" "$LOOM" bench cascade --center "$WORK/center" --edge-int8 "$WORK/small-int8" \
  --edge-int4 "$WORK/small-int4" --thresholds 0,2

# An edge with no center behind its URL (port 9 on loopback: nothing listens).
ask() {  # port -> "status answered-by cascade-note"
  python3 - "$1" <<'PY'
import json, sys, urllib.request, urllib.error
body = {"model": "gpt2-shakespeare", "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
try:
    r = urllib.request.urlopen(req, timeout=60)
    print(r.status, r.headers.get("X-Loom-Answered-By"), r.headers.get("X-Loom-Cascade"))
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("X-Loom-Answered-By"), e.headers.get("X-Loom-Cascade"))
PY
}
for down in local fail; do
  "$LOOM" serve --checkpoint "$WORK/small-int8" --role edge --center http://127.0.0.1:9 --confidence-threshold 1 \
    --center-down $down --cache-dir "$WORK/cache" --port 0 --threads 1 --kv-cache-mb 4 > "$WORK/edge.out" 2> "$WORK/edge.err" &
  SERVER=$!
  for _ in $(seq 1 100); do grep -q "ready:" "$WORK/edge.out" 2>/dev/null && break; sleep 0.1; done
  port="$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/edge.out")"
  got="$(ask "$port")"
  want="200 edge center-unreachable"
  [ $down = fail ] && want="503 None None"
  [ "$got" = "$want" ] || { echo "edge with --center-down $down answered '$got', not '$want'"; cat "$WORK/edge.out" "$WORK/edge.err"; exit 1; }
  grep -q "center http://127.0.0.1:9 unreachable" "$WORK/edge.err" || { echo "no unreachable line:"; cat "$WORK/edge.err"; exit 1; }
  kill -TERM $SERVER
  wait $SERVER
  SERVER=""
done

"$LOOM" bench cascade --quick --center "$WORK/center" --edge-int8 "$WORK/small-int8" --edge-int4 "$WORK/small-int4" \
  --update-int8 "$WORK/small2-int8" --update-int4 "$WORK/small2-int4" --out "$WORK/bench" --center-threads 1 \
  > "$WORK/bench.out" 2> "$WORK/bench.err" || { echo "bench cascade failed:"; cat "$WORK/bench.out" "$WORK/bench.err"; exit 1; }
tail -1 "$WORK/bench.out" | python3 -c '
import json, sys
line = sys.stdin.read()
assert line.startswith("SUMMARY "), line
s = json.loads(line[8:])
assert s["failed"] == 0, s
sweep = {r["threshold"]: r for r in s["sweep"]}
assert sorted(sweep) == [0, 0.5, 1], sweep
assert sweep[0]["edge_fraction"] == 1, "threshold 0 answers everything at the edge"
assert sweep[1]["edge_fraction"] == 0, "threshold 1 forwards what is not certain"
assert sweep[1]["agreement"] == 1, "forwarded answers are the center greedy ones"
for k in ("threshold", "latency_speedup", "center_load_reduction", "quality_ratio"):
    assert k in s, k
r = s["rollout"]
assert r["failed"] == 0 and r["answers_with_other_versions"] == 0, r
assert r["before"].startswith("small+") and r["after"].startswith("small2+"), r
'
grep -q "^threshold,edge_fraction" "$WORK/bench/cascade_sweep.csv"
grep -q "<svg" "$WORK/bench/cascade_sweep.svg"
ip netns list 2>/dev/null | grep -q loomh && { echo "bench cascade left test hosts behind"; exit 1; }
echo "cascade CLI: ok"
