#!/usr/bin/env bash
# Elastic restarts through Slurm on a test cluster (scripts/testcluster.sh up 2):
# examples/slurm/train.sbatch (--requeue, --resume auto) runs dp=4 over 2 nodes uninterrupted,
# then again with rank 2 killed mid-run; srun --kill-on-bad-exit ends the other ranks, the
# script requeues the job, and its second attempt resumes from the newest checkpoint and ends
# with weights and Adam moments bitwise equal to the uninterrupted run's (the check `loom bench
# chaos` makes); then the same failure inside one allocation, restarted by `loom launch
# --max-restarts` (srun again on the job's nodes, no requeue), bitwise equal too. Prints the
# time each way lost. Skips (77) where the cluster cannot be made.
#   slurm_requeue_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
tc="$src/scripts/testcluster.sh"
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_COMM_TIMEOUT
work=$(mktemp -d)
trap '"$tc" down >/dev/null 2>&1; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$src/tests/comm/slurm_helpers.sh"

cluster_up 2
prepare_text
steps=${LOOM_TEST_STEPS:-80}
every=$((steps / 4))
sets=(--set data.dir="$work/data" --set model.preset=gpt2-tiny --set model.vocab_size=256 --set data.seq_len=32
      --set data.batch_size=8 --set schedule.steps="$steps" --set schedule.warmup_steps=2
      --set schedule.eval_interval=0 --set log.every=1 --set log.progress=off --set checkpoint.every_steps="$every"
      --set parallel.dp=4)
config="$src/configs/shakespeare.yaml"
cd "$work" || fail "no work directory"

submit() {  # name: submits the example, prints the job id
  LOOM=$loom LOOM_CHECKPOINT_DIR="$work/$1" sbatch --parsable --output="$work/$1.out" \
    "$src/examples/slurm/train.sbatch" "$config" "${sets[@]}" | cut -d';' -f1
}

# The seconds from an attempt's start line to its end line in an output file.
attempt_time() {  # out attempt
  awk -v n="$2" '
    $1 == "[sbatch]" && $4 == "attempt" && $5 == n":" { start = $NF }
    $1 == "[sbatch]" && $4 == "attempt" && $5 == n && $6 == "ended" { end = $NF }
    END { if (start == "" || end == "") exit 1; printf "%.2f\n", end - start }' "$1"
}
first_start() { awk '$1 == "[sbatch]" && $4 == "attempt" && $5 == "1:" { print $NF; exit }' "$1"; }
last_end() { awk '$1 == "[sbatch]" && $6 == "ended" { t = $NF } END { print t }' "$1"; }

# Kills rank 2 of a job once its output shows step 1.5 x every: the first task on loomh2, the
# loom process whose environment says so, found first so that the kill lands close to that
# step. Sets killed_at.
strike_rank2() {  # job out step-regex
  local victim="" s="" e p
  for _ in $(seq 600); do
    for e in $(grep -l "SLURM_JOB_ID=$1" /proc/[0-9]*/environ 2>/dev/null); do
      p=$(echo "$e" | cut -d/ -f3)
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = loom ] && tr '\0' '\n' <"$e" | grep -qx SLURM_PROCID=2 &&
        tr '\0' '\n' <"$e" | grep -q '^SLURM_STEP_ID=' && victim=$p
    done
    [ -n "$victim" ] && break
    sleep 0.05
  done
  for _ in $(seq 1200); do
    s=$(grep -o "$3" "$2" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
    [ -n "$s" ] && [ "$s" -ge $((every + every / 2)) ] && break
    sleep 0.02
  done
  [ -n "$victim" ] || { cat "$2"; fail "no rank 2 of job $1 to kill (step ${s:-none})"; }
  kill -9 "$victim" || fail "rank 2 (pid $victim) was gone before step $((every + every / 2))"
  killed_at=$(date +%s.%N)
  echo "killed rank 2 (pid $victim) at step $s"
}

same_state() {  # dir: its last checkpoint bitwise equal to the uninterrupted run's
  local f
  for f in model.safetensors optimizer.exp_avg.safetensors optimizer.exp_avg_sq.safetensors; do
    cmp -s "$work/ref/$last/$f" "$1/$last/$f" || fail "$1/$last/$f differs from the uninterrupted run's"
  done
  echo "final weights and moments ($last) bitwise equal to the uninterrupted run"
}

echo "== uninterrupted: dp=4, $steps steps, a checkpoint every $every"
ref=$(submit ref)
state=$(wait_job "$ref" 120)
[ "$state" = COMPLETED ] || { cat "$work/ref.out"; fail "the uninterrupted job ended $state"; }
ref_s=$(attempt_time "$work/ref.out" 1) || fail "no attempt lines in ref.out"
echo "uninterrupted job $ref: $ref_s s"
last=$(ls -d "$work/ref"/step_* | sort | tail -1 | xargs basename)
[ "$last" = "$(printf 'step_%06d' "$steps")" ] || fail "the uninterrupted run's last checkpoint is $last"

echo "== rank 2 killed after step $((every + every / 2)); the job requeues itself and resumes"
job=$(submit hit)
strike_rank2 "$job" "$work/hit.out" '^step *[0-9]*'
state=$(wait_job "$job" 150)
[ "$state" = COMPLETED ] || { cat "$work/hit.out"; fail "the struck job ended $state"; }
cat "$work/hit.out" | grep -v '^step '
[ "$(job_field "$job" Restarts)" = 1 ] || fail "job $job restarted $(job_field "$job" Restarts) times, not once"
grep -q "^\[sbatch\] requeueing (attempt 2 of at most 4 resumes from $work/hit)" "$work/hit.out" || fail "no requeue line"

same_state "$work/hit"

# Steps the first attempt logged past the checkpoint the second resumed from: done twice.
logged=$(awk '/^\[sbatch\] .* attempt 1 ended/ { exit } /^step / { n = $2 + 0 } END { print n }' "$work/hit.out")
resumed=$(grep -o 'resumed run [0-9a-f]* from .* at step [0-9]*' "$work/hit.out" | grep -o '[0-9]*$')
[ -n "$resumed" ] && [ "$resumed" -gt 0 ] && [ "$resumed" -lt "$steps" ] ||
  fail "the second attempt did not resume mid-run (step '${resumed}')"
echo "the first attempt logged step $logged; the second resumed from step $resumed and redid $((logged - resumed)) steps"
# What the failure cost: the struck job's time from its first start to its last end, less the
# uninterrupted job's; split into the wait for the requeued attempt and the redone steps.
awk -v ref="$ref_s" -v t0="$(first_start "$work/hit.out")" -v t1="$(last_end "$work/hit.out")" \
  -v k="$killed_at" -v a2="$(awk '$1 == "[sbatch]" && $5 == "2:" { print $NF }' "$work/hit.out")" '
  BEGIN {
    printf "time lost to the failure: %.1f s (struck job %.1f s, uninterrupted %.1f s); ", t1 - t0 - ref, t1 - t0, ref
    printf "the requeued attempt started %.1f s after the kill\n", a2 - k
  }'

echo "== the same inside the allocation: loom launch --max-restarts restarts srun on the job's nodes"
job=$(sbatch --parsable -N2 --ntasks-per-node=2 --output="$work/launch.out" --wrap "$(printf '%q ' \
      "$loom" launch --max-restarts 2 --restart-delay 0.2 -- train "$config" "${sets[@]}" \
      --set checkpoint.dir="$work/launch")")
strike_rank2 "$job" "$work/launch.out" '^\[rank 0\] step *[0-9]*'
state=$(wait_job "$job" 60)
grep '^\[launch\]' "$work/launch.out"
[ "$state" = COMPLETED ] || { cat "$work/launch.out"; fail "the job under loom launch --max-restarts ended $state"; }
[ "$(job_field "$job" Restarts)" = 0 ] || fail "Slurm requeued the job that loom launch restarted"
grep -q '^\[launch\] attempt 1 failed after .*: rank 2 killed; .*restart 1 of 2 with --resume auto' "$work/launch.out" ||
  fail "loom launch did not name rank 2's failure"
grep -q '^\[launch\] job finished after 2 attempts (1 restart) in .* s; .* s lost to failures' "$work/launch.out" ||
  fail "loom launch did not report the time lost"
same_state "$work/launch"
echo PASS
