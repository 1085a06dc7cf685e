#!/usr/bin/env bash
# Elastic training end to end on 4 ranks of gpt2-tiny (about 25 s on 2 cores):
#  1. `loom bench chaos --trials 3`: a SIGKILL, a SIGSTOP (hang) and a corrupted newest
#     checkpoint + kill, each recovered by `loom launch --max-restarts` without help; the final
#     weights and moments bitwise equal to the uninterrupted run's; the hang found within the
#     collective timeout + 10 s and named (rank, collective, sequence number).
#  2. Shrink: rank 3 killed twice in a row under --min-nproc 2 -> the job goes on with 2 ranks
#     (parallel.dp=auto, the same global batch), resharding the checkpoint, and its losses stay
#     those of the uninterrupted 4-rank run (float rounding of the other reduction order).
#   elastic_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_COMM_TIMEOUT
work=$(mktemp -d)
tag="elastic-test-$$"
cleanup() {
  # Nothing of the jobs may outlive the test (a stopped rank included).
  kill_tagged "$tag"
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$src/tests/train/elastic_helpers.sh"

head -c 200000 "$src/data/tinyshakespeare/input.txt" > "$work/in.txt"
"$loom" prepare --input "$work/in.txt" --tokenizer byte --out "$work/data" >/dev/null || fail "loom prepare failed"
train=(train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" --set model.preset=gpt2-tiny
       --set model.vocab_size=256 --set data.seq_len=64 --set data.batch_size=8 --set parallel.dp=4
       --set schedule.eval_interval=0 --set log.progress=off --set checkpoint.every_steps=50)

# 1. Chaos.
"$loom" bench chaos --trials 3 --nproc 4 --timeout 3 --work "$work/chaos" -- "${train[@]}" --set schedule.steps=700 \
  > "$work/chaos.out" 2>&1
rc=$?
grep -v "^\[rank" "$work/chaos.out" | tail -20
summary=$(grep '^SUMMARY ' "$work/chaos.out" | tail -1)
[ -n "$summary" ] || fail "bench chaos printed no SUMMARY (exit $rc)"
check() { python3 -c "import json,sys; s=json.loads(sys.argv[1][8:]); sys.exit(0 if ($2) else 1)" "$summary" \
  || fail "$1: $summary"; }
check "3 trials, one of each kind" "s['trials']==3 and s['kills']==1 and s['stops']==1 and s['corrupts']==1"
check "every trial recovered and the job finished" "s['recovered']==3 and s['finished']"
check "final state bitwise equal to the uninterrupted run" "s['bitwise_equal']"
check "the hang found within the timeout + 10 s and named" \
  "len(s['hang_detect_s'])==1 and s['hang_detect_s'][0] <= s['collective_timeout_s'] + 10 and s['hangs_named']"
[ "$rc" = 0 ] || fail "bench chaos exited with $rc"

# 2. Shrink from 4 to 2 ranks.
"$loom" launch --nproc 4 -- "${train[@]}" --set schedule.steps=600 --set log.every=1 --set checkpoint.dir="$work/ref" \
  --set log.metrics_path="$work/ref.jsonl" > "$work/ref.out" 2>&1 || { tail -20 "$work/ref.out"; fail "reference run"; }
LOOM_TEST_TAG=$tag "$loom" launch --nproc 4 --max-restarts 4 --min-nproc 2 --drop-after 2 --restart-delay 0.2 -- \
  "${train[@]}" --set schedule.steps=600 --set log.every=1 --set checkpoint.dir="$work/el" \
  --set log.metrics_path="$work/el.jsonl" > "$work/el.out" 2>&1 &
job=$!
strike_ranks "$work/el.out" "$tag" 200 3 3
wait "$job"
rc=$?
grep '^\[launch\]' "$work/el.out"
[ "$rc" = 0 ] || { tail -30 "$work/el.out"; fail "the elastic job exited with $rc"; }
grep -q "going on with 2 ranks instead of 4" "$work/el.out" || fail "the job did not shrink to 2 ranks"
grep -q "resharded from pp=1 x dp=4" "$work/el.out" || fail "the 2-rank attempt did not reshard the dp=4 checkpoint"
grep -q "\[rank 0\] \[train\] 2 ranks on 1 host" "$work/el.out" || fail "no attempt ran on 2 ranks"
losses_match "$work/ref.jsonl" "$work/el.jsonl" || fail "the shrunk run's losses left the uninterrupted run's"
echo "ok: 3 chaos trials recovered bitwise; the job shrank to 2 ranks with the same losses"
