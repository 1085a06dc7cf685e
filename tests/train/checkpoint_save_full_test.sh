#!/usr/bin/env bash
# A checkpoint save that fails on one rank fails every rank at once: `loom train` on 2 ranks
# writes its checkpoints to a tmpfs with room for one and a half of them, so the second save
# runs out of space on some rank. Every rank must end with "[checkpoint] saving step 4 ...
# failed" well before the collective timeout (300 s here), the partial save must be gone, and
# the step-2 checkpoint must still be `latest` and load. Needs root for the mount (skips with
# 77 otherwise); the mount is removed on every exit.
# With `async`, checkpoints are written in the background (checkpoint.async): the failure is
# found when the write ends and must fail every rank the same way.
#   checkpoint_save_full_test.sh <loom> <source dir> [async]
set -u
loom=$1
src=$2
mode=${3:-sync}
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_COMM_TIMEOUT
[ "$(id -u)" = 0 ] || { echo "SKIPPED: mounting a small tmpfs needs root"; exit 77; }
work=$(mktemp -d)
mnt="$work/small"
cleanup() {
  mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$mnt"

head -c 100000 "$src/data/tinyshakespeare/input.txt" > "$work/in.txt"
"$loom" prepare --input "$work/in.txt" --tokenizer byte --out "$work/data" >/dev/null || fail "loom prepare failed"
train=(train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" --set model.preset=gpt2-tiny
       --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=4
       --set schedule.eval_interval=0 --set log.every=1 --set log.progress=off --set parallel.dp=2
       --set checkpoint.every_steps=2 --set checkpoint.keep_last=5 --set log.metrics_path="$work/m.jsonl")
[ "$mode" = async ] && train+=(--set checkpoint.async=true)

# The size of one checkpoint of this run, to size the tmpfs.
"$loom" launch --nproc 2 -- "${train[@]}" --set schedule.steps=2 --set checkpoint.dir="$work/probe" \
  > "$work/probe.out" 2>&1 || { cat "$work/probe.out"; fail "the probe run failed"; }
size_k=$(du -sk "$work/probe/step_000002" | cut -f1)
mount -t tmpfs -o size=$(( size_k * 3 / 2 ))k tmpfs "$mnt" || { echo "SKIPPED: cannot mount a tmpfs"; exit 77; }

t0=$(date +%s)
timeout 240 "$loom" launch --nproc 2 -- "${train[@]}" --set schedule.steps=6 --set checkpoint.dir="$mnt" \
  --set parallel.collective_timeout_s=300 > "$work/run.out" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
cat "$work/run.out"
echo "exit $rc after ${dt} s; tmpfs of $(( size_k * 3 / 2 )) KiB for checkpoints of ${size_k} KiB"
[ "$rc" -ne 0 ] || fail "the run succeeded although the second checkpoint cannot fit"
[ "$rc" -ne 124 ] || fail "the run ended by the collective timeout, not by the save failing"
[ "$dt" -lt 60 ] || fail "the ranks took ${dt} s to give up"
for r in 0 1; do
  grep -q "^\[rank $r\].*\[checkpoint\] saving step 4 to $mnt/step_000004 \(in the background \)\?failed" "$work/run.out" \
    || fail "rank $r did not report the failed save"
done
grep -q "No space left on device" "$work/run.out" || fail "no rank named the cause (no space)"
grep -q "the earlier checkpoints in $mnt are untouched" "$work/run.out" || fail "no line saying the earlier checkpoints are kept"
[ "$(cat "$mnt/latest")" = "step_000002" ] || fail "latest is '$(cat "$mnt/latest")', not step_000002"
[ ! -e "$mnt/.tmp.step_000004" ] || fail "the partial save .tmp.step_000004 was left behind"
[ ! -e "$mnt/step_000004" ] || fail "a step_000004 directory exists"
out=$("$loom" generate --checkpoint "$mnt" --prompt "ROMEO:" --max-tokens 4 --seed 1 2>&1) \
  || { echo "$out"; fail "the step-2 checkpoint does not load"; }
echo "$out" | grep -q "step_000002" || { echo "$out"; fail "generate did not use step_000002"; }
echo "ok ($mode): every rank failed the save in ${dt} s; step 2 is intact"
