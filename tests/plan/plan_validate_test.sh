#!/usr/bin/env bash
# loom plan --validate --quick: calibrates this machine, trains four layouts (one process, dp2,
# pp2 with 4 micro-batches, tp2) and compares the planner's predictions with what they
# measure. Memory must agree within 5% (the issue's target; the estimators are exact to the
# byte for these layouts). Step time is checked loosely (50%) because test machines are shared;
# each layout runs twice, round after round, keeping the faster (--repeat 2: one descheduled
# run no longer decides it), and CTest runs nothing beside it (RUN_SERIAL). docs/PERFORMANCE.md
# has the full, quiet figures.
# Also: a plan on a public cluster file ranks layouts and explains the pick, and bad input is
# refused naming the option.
set -euo pipefail
LOOM="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$LOOM" plan --validate --quick --repeat 2 --out "$WORK/v" > "$WORK/validate.log" 2>&1 || { cat "$WORK/validate.log"; exit 1; }
cat "$WORK/validate.log"
grep '^SUMMARY' "$WORK/validate.log" | sed 's/^SUMMARY //' | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["failed"] == 0, s
n, mem, t = s["layouts"], s["max_memory_error"], s["max_time_error"]
assert n == 4, f"expected 4 validated layouts, got {n}"
assert mem < 0.05, f"memory error {mem:.3f} above 5%"
assert t < 0.5, f"step-time error {t:.3f} above 50%"
for r in s["rows"]:
    assert r["measured_ms"] > 0 and r["predicted_ms"] > 0 and r["measured_bytes"] > 0, r
print("plan --validate --quick: ok")
'
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
out="$("$LOOM" plan --model "$SRC/configs/models/gpt3-13b.yaml" --cluster "$SRC/configs/clusters/dgx-a100-80g.yaml" \
  --nodes 4 --global-batch 256 --seq 2048 --precision bf16 --top 3 --explain)"
echo "$out" | grep -q "layouts considered" || { echo "no ranking: $out"; exit 1; }
echo "$out" | grep -q "matrix products" || { echo "no explanation: $out"; exit 1; }
err="$("$LOOM" plan --model gpt2-124m --cluster "$SRC/configs/clusters/dgx-a100-80g.yaml" --global-batch 8 --seq 128 \
  --layout dp=3,tp=1 2>&1)" && { echo "an invalid layout was accepted"; exit 1; }
case "$err" in *"is not the global batch 8"*) ;; *) echo "unclear refusal: $err"; exit 1 ;; esac
err="$("$LOOM" plan --model gpt2-124m --cluster /nonexistent.yaml --global-batch 8 --seq 128 2>&1)" && exit 1
case "$err" in *"cannot read the cluster file /nonexistent.yaml"*) ;; *) echo "unclear refusal: $err"; exit 1 ;; esac
echo "plan cli: ok"
