#!/usr/bin/env bash
# parallel.micro_batches=auto end to end under loom launch (issue #41, item 3):
#   - a 2-stage pipeline starting at 2 micro-batches: the tuner logs each change with its reason
#     and settles, the metrics record the count each step ran with, and the loss trajectory
#     equals that of fixed parallel.micro_batches=2 and =8 runs (same rows, same order; only the
#     grouping differs, so to summation rounding, 1e-6 relative);
#   - data parallelism without a pipeline starting at 8 (no bubble): the first move is to fewer;
#   - ZB-H1, ZB-V and interleaved 1F1B change counts too (their schedules rebuilt) with the losses
#     of a fixed count, and interleaving leaves out the counts that are not multiples of pp.
#   auto_micro_batches_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$loom" prepare --input "$src/data/tinyshakespeare/input.txt" --tokenizer byte --out "$work/data" \
  --force >/dev/null || fail "loom prepare failed"
run() {  # run NAME SETTINGS...: 2 ranks, 24 steps of 32 sequences
  local name=$1; shift
  "$loom" launch --nproc 2 -- train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" \
    --set model.preset=gpt2-tiny --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=32 \
    --set schedule.steps=24 --set schedule.eval_interval=0 --set log.every=1 --set log.progress=off \
    --set checkpoint.every_steps=0 --set checkpoint.dir="$work/ck-$name" \
    --set log.metrics_path="$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "$name: training failed"; }
}
run auto --set parallel.pp=2 --set parallel.micro_batches=auto
run m2 --set parallel.pp=2 --set parallel.micro_batches=2
run m8 --set parallel.pp=2 --set parallel.micro_batches=8
run dp --set parallel.dp=2 --set parallel.micro_batches=auto --set data.micro_batch_size=2
# The other schedules rebuild theirs on each change: ZB-H1, interleaved 1F1B and ZB-V (4 blocks, 2
# chunks a stage), each against its own fixed count.
four=(--set parallel.pp=2 --set model.n_layer=4)
run zb "${four[@]}" --set parallel.pp_schedule=zb1p --set parallel.micro_batches=auto
run zb4 "${four[@]}" --set parallel.pp_schedule=zb1p --set parallel.micro_batches=4
run iv "${four[@]}" --set parallel.virtual_stages=2 --set parallel.micro_batches=auto
run iv4 "${four[@]}" --set parallel.virtual_stages=2 --set parallel.micro_batches=4
run zbv "${four[@]}" --set parallel.pp_schedule=zbv --set parallel.micro_batches=auto
run zbv4 "${four[@]}" --set parallel.pp_schedule=zbv --set parallel.micro_batches=4
grep "\[micro-batches\]" "$work/auto.log" "$work/dp.log"

python3 - "$work" <<'PY' || fail "auto micro-batches"
import json, re, sys
w = sys.argv[1]
def steps(name):
    return [j for j in map(json.loads, open(f"{w}/{name}.jsonl")) if "loss" in j and "event" not in j]
def log(name):
    return [l for l in open(f"{w}/{name}.log") if "[micro-batches]" in l]
auto, m2, m8 = steps("auto"), steps("m2"), steps("m8")
if len(auto) != 24 or len(m2) != 24 or len(m8) != 24: sys.exit("expected 24 logged steps in each run")
for name, ref in (("micro_batches=2", m2), ("micro_batches=8", m8)):
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(auto, ref))
    if worst > 1e-6: sys.exit(f"auto's losses differ from {name}'s by {worst:.2e} relative")
counts = [j["micro_batches"] for j in auto]
if counts[0] != 2 or len(set(counts)) < 2: sys.exit(f"auto never changed the count: {counts}")
if any(32 % c for c in counts): sys.exit(f"a count that does not divide the batch: {counts}")
if {j["micro_batches"] for j in m8} != {8}: sys.exit("a fixed count changed")
lines = log("auto")
if not re.search(r"starting at 2 of 16 sequences; choosing among 1, 2, 4, 8, 16, 32", lines[0]): sys.exit(lines[0])
if not re.search(r"step 4: 2 micro-batches took [\d.]+ ms a step \(median of 3\), \d+% of it pipeline bubble", lines[1]):
    sys.exit(f"first change: {lines[1]}")
if not any("settled on" in l for l in lines): sys.exit("auto never settled")
settled = int(re.search(r"settled on (\d+)", [l for l in lines if "settled on" in l][0]).group(1))
if counts[-1] != settled: sys.exit(f"settled on {settled} but ran {counts[-1]}")
for name, ref in (("zb", "zb4"), ("iv", "iv4"), ("zbv", "zbv4")):
    a, b = steps(name), steps(ref)
    worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))
    if len(a) != 24 or worst > 1e-6: sys.exit(f"{name}: losses differ from {ref}'s by {worst:.2e}")
    if len({j["micro_batches"] for j in a}) < 2: sys.exit(f"{name}: the count never changed")
if "(1: not taken by parallel.pp_schedule=1f1b with parallel.virtual_stages=2)" not in log("iv")[0]:
    sys.exit(f"iv: {log('iv')[0]}")
dp = log("dp")
if "starting at 8 of 2 sequences" not in dp[0] or "trying fewer and larger ones, 4" not in dp[1]:
    sys.exit(f"dp: {dp[:2]}")
print(f"ok: counts {counts}")
PY
echo PASS
