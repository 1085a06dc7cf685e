#!/usr/bin/env bash
# parallel.micro_batches=auto against a sweep of fixed counts (issue #41, item 3's target: auto's
# step within 5% of the best fixed count's). A 2-stage pipeline of gpt2-shakespeare on Tiny
# Shakespeare (bytes), 32 sequences of 128 tokens a step, one thread per rank; configured at
# START micro-batches (default 1: half of every step is bubble). Each fixed count trains STEPS
# steps, auto trains 2 x STEPS; step times are medians over the steps after the first 5 (auto:
# after it settled). Rounds alternate the runs (ROUNDS, default 2), and the medians pool them.
#   bench/auto_micro_batches.sh BUILD_DIR [STEPS=30] [START=1] [ROUNDS=2]
set -euo pipefail
build=${1:?usage: bench/auto_micro_batches.sh BUILD_DIR [STEPS] [START] [ROUNDS]}
steps=${2:-30}
start=${3:-1}
rounds=${4:-2}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
loom="$build/bin/loom"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
"$loom" prepare --input "$src/data/tinyshakespeare/input.txt" --tokenizer byte --out "$work/data" --force >/dev/null
run() {  # run NAME STEPS SETTINGS...
  local name=$1 n=$2; shift 2
  "$loom" launch --nproc 2 -- train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" \
    --set model.preset=gpt2-shakespeare --set data.seq_len=128 --set data.batch_size=32 \
    --set schedule.steps="$n" --set schedule.eval_interval=0 --set log.every=1 --set log.progress=off \
    --set checkpoint.every_steps=0 --set checkpoint.dir="$work/ck-$name" --set parallel.pp=2 \
    --set log.metrics_path="$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) cores; $(date -u '+%F %T') UTC"
for r in $(seq 1 "$rounds"); do
  for m in 1 2 4 8 16 32; do run "m$m-r$r" "$steps" --set parallel.micro_batches="$m"; done
  run "auto-r$r" $((2 * steps)) --set parallel.micro_batches=auto --set data.micro_batch_size=$((32 / start))
  grep -h "\[micro-batches\]" "$work/auto-r$r.log" | sed 's/^\[rank 0\] /  /'
done
python3 - "$work" "$rounds" "$start" <<'PY'
import json, statistics, sys
w, rounds, start = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def times(name, after):
    rows = [j for j in map(json.loads, open(f"{w}/{name}.jsonl")) if "ms_per_step" in j and "event" not in j]
    return [j["ms_per_step"] for j in rows[after:]], [j["micro_batches"] for j in rows]
fixed = {}
for m in (1, 2, 4, 8, 16, 32):
    fixed[m] = statistics.median(sum((times(f"m{m}-r{r}", 5)[0] for r in range(1, rounds + 1)), []))
auto, settled = [], []
for r in range(1, rounds + 1):
    _, counts = times(f"auto-r{r}", 0)
    # settled: the count of the last step; the steps after the tuner last changed it
    last_change = max(i for i in range(len(counts)) if i == 0 or counts[i] != counts[i - 1])
    t, _ = times(f"auto-r{r}", last_change + 1)
    auto += t
    settled.append(counts[-1])
best = min(fixed, key=fixed.get)
print("fixed micro-batches: " + ", ".join(f"m={m} {t:.1f} ms" for m, t in fixed.items()))
print(f"best fixed: m={best}, {fixed[best]:.1f} ms a step")
a = statistics.median(auto)
print(f"auto (from m={start}): settled on {settled}, {a:.1f} ms a step after settling: "
      f"{a / fixed[best]:.3f}x the best fixed count's (target: at most 1.05x)")
PY
