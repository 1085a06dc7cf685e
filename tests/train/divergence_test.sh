#!/usr/bin/env bash
# The loss guards on by default, end to end (about 15 s on 2 cores). On the Tiny Shakespeare
# config with gpt2-tiny, five runs that diverge: lr 10 with and without clipping, beta2 0 with
# eps 1e-30, llama-tiny at lr 10, and dp=2 under `loom launch --max-restarts 2`. Each must
#  - exit with the divergence status (3) and say "diverged" or "nonfinite" in SUMMARY,
#  - stop within 100 steps of the loss first doubling (a step's loss above twice the lowest
#    before it),
#  - have had the spike guard fire at least once,
#  - leave `latest` at a checkpoint from before that step and none from it on (checkpoints every
#    2 steps),
# and the launcher must not restart the dp=2 run. A healthy run of the same config finishes with
# status 0, no spike and no divergence; `loom report` says how each ended.
#   divergence_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$loom" prepare --input "$src/data/tinyshakespeare/input.txt" --tokenizer byte --out "$work/data" >/dev/null \
  || fail "loom prepare failed"
base=(train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" --set model.vocab_size=256
      --set data.seq_len=64 --set schedule.steps=200 --set schedule.eval_interval=0 --set log.every=1
      --set log.progress=off --set checkpoint.every_steps=2 --set checkpoint.keep_last=2)

# check NAME OUT JSONL CKDIR: the assertions above on one diverged run.
check() {
  local name=$1 out=$2 jsonl=$3 ck=$4
  local summary latest
  summary=$(grep '^SUMMARY ' "$out" | tail -1)
  [ -n "$summary" ] || { tail -20 "$out"; fail "$name: no SUMMARY"; }
  latest=$(cat "$ck/latest" 2>/dev/null || echo none)
  python3 - "$name" "$summary" "$jsonl" "$latest" "$ck" <<'EOF' || { grep '\[guard\]' "$out" | tail -5; fail "$name"; }
import json, sys
import os, re
name, summary, jsonl, latest, ck = sys.argv[1], json.loads(sys.argv[2][8:]), sys.argv[3], sys.argv[4], sys.argv[5]
steps, low, doubled, spikes = {}, float("inf"), None, 0
for line in open(jsonl):
    j = json.loads(line)
    if j.get("event") == "spike":
        spikes += 1
    if "loss" in j and "event" not in j and j["loss"] is not None:
        if doubled is None and j["loss"] > 2 * low:
            doubled = j["step"]
        low = min(low, j["loss"])
ok = True
def need(cond, what):
    global ok
    if not cond:
        print(f"{name}: {what}; SUMMARY {json.dumps(summary)[:400]}")
        ok = False
need(summary["ended"] in ("diverged", "nonfinite"), f"ended {summary['ended']}, not diverged or nonfinite")
need(doubled is not None, "the loss never doubled: the run shows nothing")
if doubled is not None:
    need(summary["steps"] - doubled <= 100, f"stopped at step {summary['steps']}, {summary['steps'] - doubled} steps after the loss doubled at {doubled}")
    need(latest != "none", "no `latest` left: the checkpoint from before the divergence was lost")
    if latest != "none":
        need(int(latest.strip().split("_")[1]) < doubled, f"latest is {latest.strip()}, not from before step {doubled}")
    later = [d for d in os.listdir(ck) if re.fullmatch(r"step_\d+", d) and int(d[5:]) >= doubled]
    need(not later, f"checkpoints from step {doubled} on are left: {later}")
need(spikes >= 1, "the spike guard never fired")
print(f"{name}: {summary['ended']} at step {summary['steps']} (doubled at {doubled}, {spikes} spikes, "
      f"last healthy {summary.get('last_healthy_step')}, latest {latest.strip()})")
sys.exit(0 if ok else 1)
EOF
}

run() {  # run NAME SETTINGS...: one process
  local name=$1
  shift
  "$loom" "${base[@]}" --set checkpoint.dir="$work/$name" --set log.metrics_path="$work/$name.jsonl" "$@" \
    > "$work/$name.out" 2>&1
  local rc=$?
  [ "$rc" = 3 ] || { tail -20 "$work/$name.out"; fail "$name exited with $rc, not the divergence status 3"; }
  check "$name" "$work/$name.out" "$work/$name.jsonl" "$work/$name"
}

run lr10 --set model.preset=gpt2-tiny --set optim.lr=10
run lr10-noclip --set model.preset=gpt2-tiny --set optim.lr=10 --set schedule.clip.max_norm=0
run beta2-0 --set model.preset=gpt2-tiny --set optim.beta2=0 --set optim.eps=1e-30
run llama --set model.preset=llama-tiny --set optim.lr=10
grep -q "Likely causes: optim.lr=10 is high" "$work/lr10.out" || fail "the log does not name the learning rate"
grep -q "optim.beta2=0 is low.*optim.eps=1e-30 is tiny" "$work/beta2-0.out" || fail "the log does not name beta2, eps"

# dp=2 under the elastic launcher: diverged, not restarted.
"$loom" launch --nproc 2 --max-restarts 2 --restart-delay 0.1 -- "${base[@]}" --set model.preset=gpt2-tiny \
  --set optim.lr=10 --set parallel.dp=2 --set checkpoint.dir="$work/dp2" --set log.metrics_path="$work/dp2.jsonl" \
  > "$work/dp2.out" 2>&1
rc=$?
grep '^\[launch\]' "$work/dp2.out"
[ "$rc" = 3 ] || { tail -20 "$work/dp2.out"; fail "loom launch exited with $rc, not the divergence status 3"; }
grep -q '^\[launch\] attempt 1 diverged: .*not restarting' "$work/dp2.out" || fail "the launcher did not say why"
[ "$(grep -c '^\[rank 0\] \[train\] collective timeout' "$work/dp2.out")" = 1 ] || fail "the launcher restarted it"
sed 's/^\[rank 0\] //' "$work/dp2.out" > "$work/dp2.rank0"
check dp2 "$work/dp2.rank0" "$work/dp2.jsonl" "$work/dp2"

# A healthy run: no spike, no divergence, status 0.
"$loom" "${base[@]}" --set model.preset=gpt2-tiny --set checkpoint.dir="$work/ok" \
  --set log.metrics_path="$work/ok.jsonl" > "$work/ok.out" 2>&1 || { tail -20 "$work/ok.out"; fail "healthy run"; }
grep -q '^SUMMARY .*"ended":"finished".*"spikes":0' "$work/ok.out" || fail "healthy run: $(grep SUMMARY "$work/ok.out")"

# The report says how each ended.
"$loom" report "$work/lr10" --metrics "$work/lr10.jsonl" --out "$work/lr10.html" | tee "$work/report.out"
grep -q 'DIVERGED at step [0-9]* (began after step [0-9]*)' "$work/report.out" || fail "report: no divergence"
grep -q 'training diverged: ' "$work/lr10.html" || fail "report: no reason"
"$loom" report "$work/ok" --metrics "$work/ok.jsonl" --out "$work/ok.html" | grep -q ', finished$' \
  || fail "report: the healthy run did not finish"
echo PASS
