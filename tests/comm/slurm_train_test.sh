#!/usr/bin/env bash
# loom on a Slurm test cluster (scripts/testcluster.sh up 2): examples/slurm/train.sbatch as a
# user submits it, dp=4 and tp=2 x dp=2 (tp inside a node) over 2 nodes x 2 tasks through srun
# --mpi=pmix, must log the single process's loss at every step (1e-5 relative); examples/slurm/serve.sbatch answers a request
# from a node, tensor-parallel over its tasks; `loom launch` inside an allocation starts its
# ranks with srun; and jobs started wrong (srun without PMIx, a task count the layout does not
# take) fail at once with the fix named, are not requeued, and leave nothing running; `down`
# removes every daemon, host and file. Skips (77) where the cluster cannot be made (not
# root, no namespaces) or python3 is missing.
#   slurm_train_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
tc="$src/scripts/testcluster.sh"
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_COMM_TIMEOUT
work=$(mktemp -d)
trap '"$tc" down >/dev/null 2>&1; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$src/tests/comm/losses_helpers.sh"
. "$src/tests/comm/slurm_helpers.sh"
command -v python3 >/dev/null || { echo "SKIPPED: the Slurm examples were not tested: no python3 to send the server a request"; exit 77; }

cluster_up 2
prepare_text
sets=(--set data.dir="$work/data" --set model.preset=gpt2-tiny --set model.vocab_size=256 --set data.seq_len=32
      --set data.batch_size=8 --set schedule.steps=12 --set schedule.warmup_steps=2 --set schedule.eval_interval=0
      --set log.every=1 --set log.progress=off --set checkpoint.every_steps=0)
config="$src/configs/shakespeare.yaml"

echo "== one process"
"$loom" train "$config" "${sets[@]}" --set checkpoint.dir="$work/one" --set log.metrics_path="$work/one.jsonl" \
  >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "the single-process run failed"; }

# Two layouts at once (each takes 2 of a node's 4 slots): dp=4, and tp=2 x dp=2, whose tp
# pairs must stay inside a node (srun's block distribution), where loom does not warn.
echo "== sbatch examples/slurm/train.sbatch: dp=4, and tp=2 x dp=2, on 2 nodes x 2 tasks"
cd "$work" || fail "no work directory"
start=$(date +%s.%N)
declare -A jobs
for layout in dp4 tp2dp2; do
  case $layout in
    dp4) par=(--set parallel.dp=4) ;;
    tp2dp2) par=(--set parallel.tp=2 --set parallel.dp=2) ;;
  esac
  jobs[$layout]=$(LOOM=$loom LOOM_CHECKPOINT_DIR="$work/ck-$layout" sbatch --parsable --output="$work/$layout.out" \
                  "$src/examples/slurm/train.sbatch" "$config" "${sets[@]}" "${par[@]}" \
                  --set log.metrics_path="$work/$layout.jsonl") || fail "sbatch refused the example ($layout)"
done
for layout in dp4 tp2dp2; do
  job=${jobs[$layout]}
  state=$(wait_job "$job" 60)
  grep -v '^step ' "$work/$layout.out"
  [ "$state" = COMPLETED ] || { cat "$work/$layout.out"; fail "$layout: job $job ended $state, not COMPLETED"; }
  grep -q '^\[train\] 4 ranks on 2 hosts; collectives: ' "$work/$layout.out" || fail "$layout: the ranks did not find 2 hosts"
  grep -q 'warning: the tp group' "$work/$layout.out" && fail "$layout: a warning about tp across hosts"
  grep -q "^\[sbatch\] job $job attempt 1: 4 tasks on loomh\[1-2\]" "$work/$layout.out" || fail "$layout: no attempt line"
  [ -d "$work/ck-$layout/step_000012" ] || fail "$layout: no step-12 checkpoint in the shared checkpoint dir"
  losses_equal "$work/one.jsonl" "$work/$layout.jsonl" 12 "$layout under srun --mpi=pmix" ||
    fail "$layout under Slurm differs from the single process"
done
echo "both jobs took $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s from sbatch to their end"
nothing_left "the finished jobs"

echo "== loom launch inside an allocation: srun, the allocation's tasks, labelled output; mpirun in a step"
job=$(sbatch --parsable -N2 --ntasks-per-node=2 --output="$work/launch.out" \
      --wrap "LOOM_LAUNCH_EXE=/bin/sh $loom launch --dry-run -- -c true &&
        srun --ntasks=1 $loom launch --nproc 2 --dry-run -- version &&
        LOOM_LAUNCH_EXE=/bin/sh $loom launch -- -c 'echo host=\$(hostname) local=\$SLURM_LOCALID pmix=\${PMIX_RANK-}'")
state=$(wait_job "$job" 30)
cat "$work/launch.out"
[ "$state" = COMPLETED ] || fail "loom launch in an allocation: job $job ended $state"
grep -qF "srun --ntasks=4 --mpi=pmix --kill-on-bad-exit=1 --distribution=block" "$work/launch.out" ||
  fail "loom launch did not choose srun with the allocation's 4 tasks"
grep -qE "^mpirun -np 2 .*$loom version$" "$work/launch.out" || fail "inside a job step loom launch did not keep mpirun"
for want in "[rank 0] host=loomh1 local=0 pmix=0" "[rank 1] host=loomh1 local=1 pmix=1" \
            "[rank 2] host=loomh2 local=0 pmix=2" "[rank 3] host=loomh2 local=1 pmix=3"; do
  grep -qxF "$want" "$work/launch.out" || fail "no line '$want'"
done

echo "== sbatch examples/slurm/serve.sbatch: tensor parallel over loomh1's 2 tasks, answering"
job=$(LOOM=$loom LOOM_PORT=8123 sbatch --parsable --output="$work/serve.out" "$src/examples/slurm/serve.sbatch" \
      gpt2-tiny) || fail "sbatch refused the serve example"
for _ in $(seq 300); do grep -q '^\[serve\] ready' "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^\[serve\] ready: .*tensor-parallel over 2 ranks' "$work/serve.out" || { cat "$work/serve.out"; fail "not ready"; }
grep -q '^\[sbatch\] job [0-9]* serves on http://loomh1:8123 with 2 ranks' "$work/serve.out" || fail "no address line"
reply=$(python3 -c '
import json, sys, urllib.request
body = json.dumps({"model": "gpt2-tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
req = urllib.request.Request(sys.argv[1], body, {"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the test network, never a proxy
print(opener.open(req, timeout=20).read().decode())' http://198.18.0.11:8123/v1/completions) ||
  fail "no answer from loomh1:8123"
echo "$reply"
[[ $reply == *'"choices"'* && $reply == *'"completion_tokens":4'* ]] || fail "not a completion of 4 tokens: $reply"
scancel "$job"
[ "$(wait_job "$job" 30)" = CANCELLED ] || fail "the server's job did not end when cancelled"
nothing_left "the cancelled server"

echo "== srun without PMIx: refused with the fix, not requeued"
sbatch_bad() {  # name script-args...: the job must fail (status 2) without a requeue
  local name=$1 state
  shift
  job=$(sbatch --parsable --output="$work/$name.out" "$@") || fail "$name: sbatch refused it"
  state=$(wait_job "$job" 30)
  cat "$work/$name.out"
  [ "$state" = FAILED ] || fail "$name: job $job ended $state, not FAILED"
  grep -q 'not requeueing: status 2' "$work/$name.out" || fail "$name: the script did not stop with status 2"
  [ "$(job_field "$job" Restarts)" = 0 ] || fail "$name: the job was requeued"
  nothing_left "$name"
}
# The example with srun's plugin swapped: what a site whose srun lacks --mpi=pmix would run.
sed 's/--mpi=pmix/--mpi=none/' "$src/examples/slurm/train.sbatch" >"$work/no-pmix.sbatch"
LOOM=$loom LOOM_CHECKPOINT_DIR="$work/ck-none" sbatch_bad no-pmix "$work/no-pmix.sbatch" "$config" "${sets[@]}" \
  --set parallel.dp=4
grep -qF "[launch] srun started this as task 0 of 4 without an MPI plugin (srun --mpi=none, or the cluster's MpiDefault), which gives Open MPI no peers" \
  "$work/no-pmix.out" || fail "srun --mpi=none: no clear error"
grep -qF "Run srun --mpi=pmix" "$work/no-pmix.out" || fail "srun --mpi=none: the fix is not named"

echo "== a task count the layout does not take: refused with the fix, not requeued"
LOOM=$loom LOOM_CHECKPOINT_DIR="$work/ck-dp2" sbatch_bad dp2 "$src/examples/slurm/train.sbatch" "$config" \
  "${sets[@]}" --set parallel.dp=2
grep -qF "[launch] srun started 4 tasks but pp=1 x dp=2 x ep=1 x tp=1 = 2 ranks; submit with sbatch --ntasks=2" \
  "$work/dp2.out" || fail "dp=2 on 4 tasks: no clear error"
[ -z "$(ls -A "$work/ck-dp2" 2>/dev/null)" ] || fail "the refused job wrote checkpoints"

echo "== status, then down (twice): no daemon, host or file left"
"$tc" status || fail "status: a daemon is not running"
"$tc" down && "$tc" down || fail "down failed"
left=$(pgrep -a -f '/run/loom-testcluster' ; ip netns list 2>/dev/null | grep -E '^loomh[0-9]+'; ls -d /run/loom-testcluster 2>/dev/null)
[ -z "$left" ] || fail "left after down: $left"
"$tc" status >/dev/null
[ $? -eq 3 ] || fail "status did not say down (3)"
# A daemon that does not start: up fails naming it and removes what it had made (munged,
# slurmctld, the hosts).
mkdir -p "$work/bin"
printf '#!/bin/sh\necho "no slurmd today" >&2\nexit 1\n' >"$work/bin/slurmd"
chmod +x "$work/bin/slurmd"
out=$(PATH="$work/bin:$PATH" "$tc" up 2 2>&1) && fail "up with a failing slurmd succeeded"
echo "$out" | grep -qF "[testcluster] slurmd on loomh1 did not start: no slurmd today" || fail "unclear: $out"
left=$(pgrep -a -f '/run/loom-testcluster' ; ip netns list 2>/dev/null | grep -E '^loomh[0-9]+'; ls -d /run/loom-testcluster 2>/dev/null)
[ -z "$left" ] || fail "left after a failed up: $left"
if command -v setpriv >/dev/null 2>&1; then
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$tc" up 2 2>&1)
  rc=$?
  [ "$rc" -eq 77 ] && echo "$out" | grep -qF "needs root" || fail "as nobody: rc=$rc, '$out'"
fi
echo PASS
