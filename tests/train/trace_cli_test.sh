#!/usr/bin/env bash
# Step traces end to end: `loom train --trace DIR` on 2 ranks under `loom launch` (dp=2, and
# a 2-stage pipeline with activation checkpointing), then `loom trace merge DIR`. Checks each
# rank's file and the merged timeline: both ranks, forward/backward per block, the optimizer,
# collectives with their bytes, pipeline sends/receives and waits, events sorted in a sane
# span; bench finetune's ranks, one directory per degree; and that merge refuses a missing
# directory and a malformed file, naming them.
#   trace_cli_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_TRACE_DIR
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$loom" prepare --input "$src/data/tinyshakespeare/input.txt" --tokenizer byte --out "$work/data" \
  --force >/dev/null || fail "loom prepare failed"
tiny=(train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" --set model.preset=gpt2-tiny
      --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=8 --set schedule.steps=3
      --set schedule.eval_interval=0 --set log.every=1 --set log.progress=off
      --set checkpoint.every_steps=0)

# check DIR LAYOUT: the per-rank files and the merged timeline of one run.
check() {
  python3 - "$1" "$2" <<'EOF' || fail "$2: trace check failed"
import json, sys, glob, os
d, layout = sys.argv[1], sys.argv[2]
def bad(msg): sys.exit(f"{layout}: {msg}")
files = sorted(glob.glob(os.path.join(d, "trace-rank*.json")))
if [os.path.basename(f) for f in files] != ["trace-rank0.json", "trace-rank1.json"]:
    bad(f"expected one file per rank, got {files}")
per_rank = {}
for f in files:
    doc = json.load(open(f))
    m = doc["metadata"]
    if m["world_size"] != 2 or "clock_offset_us" not in m: bad(f"{f}: metadata {m}")
    if m["rank"] == 1 and not (0 <= m["clock_rtt_us"] < 1e6): bad(f"{f}: no clock measurement: {m}")
    per_rank[m["rank"]] = [e for e in doc["traceEvents"] if e["ph"] == "X"]
def names(ev): return {e["name"] for e in ev}
def layers(ev, name): return {e["args"]["layer"] for e in ev if e["name"] == name}
def comm(ev, ops): return [e for e in ev if e["cat"] == "comm" and e["name"] in ops]
for r, ev in per_rank.items():
    if not ev: bad(f"rank {r}: no events")
    if "train step" not in names(ev): bad(f"rank {r}: no train step events")
    if not names(ev) & {"adamw", "optimizer"}: bad(f"rank {r}: no optimizer events")
    for e in comm(ev, {"all_reduce", "reduce_scatter", "all_gather", "send", "recv"}):
        if e["args"]["bytes"] <= 0: bad(f"rank {r}: {e['name']} without bytes: {e}")
if layout == "dp":
    for r, ev in per_rank.items():
        for n in ("forward block", "backward block"):
            if layers(ev, n) != {0, 1}: bad(f"rank {r}: {n} for layers {layers(ev, n)}, want 0 and 1")
        if not comm(ev, {"all_reduce", "reduce_scatter"}): bad(f"rank {r}: no gradient all_reduce/reduce_scatter")
        if not any(e["cat"] == "wait" for e in ev): bad(f"rank {r}: no wait events")
else:  # pp: stage r holds layer r, recomputed under activation checkpointing
    for r, ev in per_rank.items():
        for n in ("forward block", "backward block", "recompute block"):
            if layers(ev, n) != {r}: bad(f"rank {r}: {n} for layers {layers(ev, n)}, want {{{r}}}")
        if "forward micro-batch" not in names(ev): bad(f"rank {r}: no micro-batch events")
    if not comm(per_rank[0], {"send"}) or not comm(per_rank[0], {"recv"}): bad("rank 0: no pipeline send and recv")
    if not comm(per_rank[1], {"send"}) or not comm(per_rank[1], {"recv"}): bad("rank 1: no pipeline send and recv")
    if "wait recv gradient" not in names(per_rank[0]): bad("rank 0: no wait for the gradient")
    if "wait recv activation" not in names(per_rank[1]): bad("rank 1: no wait for the activation")
    if "head+loss" not in names(per_rank[1]) or "head+loss" in names(per_rank[0]): bad("head+loss on the wrong stage")

merged = json.load(open(os.path.join(d, "merged.json")))
ev = [e for e in merged["traceEvents"] if e["ph"] == "X"]
procs = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
if procs != {0: "rank 0", 1: "rank 1"}: bad(f"merged: process names {procs}")
if {e["pid"] for e in ev} != {0, 1}: bad("merged: not both ranks")
if len(ev) != sum(len(v) for v in per_rank.values()): bad("merged: events lost")
ts = [e["ts"] for e in ev]
if ts != sorted(ts): bad("merged: events not sorted by ts")
if min(ts) != 0: bad(f"merged: timeline does not start at 0 ({min(ts)})")
span_us = max(e["ts"] + e["dur"] for e in ev)
if not 0 < span_us < 120e6: bad(f"merged: span {span_us} us")
# Both ranks run the same steps: on one clock their train steps overlap.
steps = {r: [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["pid"] == r and e["name"] == "train step"] for r in (0, 1)}
if len(steps[0]) != 3 or len(steps[1]) != 3: bad(f"merged: train steps {steps}")
if not all(a0 < b1 and a1 < b0 for (a0, b0), (a1, b1) in zip(steps[0], steps[1])): bad(f"merged: ranks' steps apart {steps}")
print(f"{layout}: ok, {len(ev)} events over {span_us / 1e3:.1f} ms")
EOF
}

for layout in dp pp; do
  dir="$work/trace-$layout"
  if [ $layout = dp ]; then set_=(--set parallel.dp=2); else
    set_=(--set parallel.pp=2 --set parallel.micro_batches=2 --set model.activation_checkpoint_interval=1); fi
  out=$("$loom" launch --nproc 2 -- "${tiny[@]}" "${set_[@]}" --set checkpoint.dir="$work/ck-$layout" \
        --set log.metrics_path="$work/$layout.jsonl" --trace "$dir" 2>&1) || { echo "$out"; fail "$layout: training failed"; }
  echo "$out" | grep -q "\[trace\] wrote $dir/trace-rank0.json" || { echo "$out"; fail "$layout: no line saying where the trace went"; }
  merge=$("$loom" trace merge "$dir" 2>&1) || { echo "$merge"; fail "$layout: trace merge failed"; }
  echo "$merge"
  echo "$merge" | grep -q "merged 2 ranks" || fail "$layout: merge summary"
  check "$dir" $layout
done

# The merge puts each rank on rank 0's clock: rank 1's events written 1 s early with a clock
# offset 1 s larger merge into the same timeline.
python3 - "$work/trace-dp" "$work/shifted" <<'EOF' || fail "shifting a rank's clock"
import json, os, sys
src, dst = sys.argv[1:]
os.makedirs(dst)
for r in (0, 1):
    d = json.load(open(f"{src}/trace-rank{r}.json"))
    if r == 1:
        d["metadata"]["clock_offset_us"] += 1e6
        for e in d["traceEvents"]:
            if "ts" in e: e["ts"] -= 1e6
    json.dump(d, open(f"{dst}/trace-rank{r}.json", "w"))
EOF
"$loom" trace merge "$work/shifted" >/dev/null || fail "merge of the shifted traces failed"
python3 - "$work/trace-dp/merged.json" "$work/shifted/merged.json" <<'EOF' || fail "a clock offset is not applied"
import json, sys
def timeline(p):
    return sorted((e["pid"], e["name"], e["ts"]) for e in json.load(open(p))["traceEvents"] if e["ph"] == "X")
a, b = timeline(sys.argv[1]), timeline(sys.argv[2])
differ = [(x, y) for x, y in zip(a, b) if x[:2] != y[:2] or abs(x[2] - y[2]) > 0.01]
if len(a) != len(b) or differ: sys.exit(f"shifted merge differs: {differ[:3]}")
EOF

# bench finetune starts its own ranks, once per degree: each launch traces into DIR/dp<N>, and
# the launching process writes no empty trace-rank0.json over rank 0's.
out=$("$loom" bench finetune --model llama-tiny --peer none --dp 1,2 --batch 2 --micro-batch 1 --seq 16 \
      --steps 1 --warmup 0 --threads 2 --trace "$work/ft" 2>&1) || { echo "$out"; fail "bench finetune --trace failed"; }
python3 - "$work/ft" <<'EOF' || fail "bench finetune's traces"
import glob, json, os, sys
d = sys.argv[1]
files = sorted(os.path.relpath(f, d) for f in glob.glob(f"{d}/**/*.json", recursive=True))
want = ["dp1/trace-rank0.json", "dp2/trace-rank0.json", "dp2/trace-rank1.json"]
if files != want: sys.exit(f"bench finetune --trace wrote {files}, want {want}")
for f in want:
    names = {e["name"] for e in json.load(open(f"{d}/{f}"))["traceEvents"] if e["ph"] == "X"}
    if not {"forward block", "backward block", "head+loss"} <= names: sys.exit(f"{f}: events {sorted(names)}")
EOF

# Refusals name the thing.
msg=$("$loom" trace merge "$work/none" 2>&1) && fail "merge of a missing directory succeeded"
echo "$msg" | grep -q "\[trace\] $work/none: no such directory" || fail "missing dir message: $msg"
mkdir "$work/empty"
msg=$("$loom" trace merge "$work/empty" 2>&1) && fail "merge of an empty directory succeeded"
echo "$msg" | grep -q "no trace-rank<R>.json files" || fail "empty dir message: $msg"
echo '{"traceEvents": [' > "$work/empty/trace-rank0.json"
msg=$("$loom" trace merge "$work/empty" 2>&1) && fail "merge of a truncated file succeeded"
echo "$msg" | grep -q "trace-rank0.json: not valid JSON" || fail "truncated file message: $msg"
echo '{"events": []}' > "$work/empty/trace-rank0.json"
msg=$("$loom" trace merge "$work/empty" 2>&1) && fail "merge of a non-trace file succeeded"
echo "$msg" | grep -q "trace-rank0.json: not a trace file (no traceEvents)" || fail "non-trace message: $msg"
echo PASS
