#!/usr/bin/env bash
# `loom train` on 2 ranks under `loom launch` with rank 1 frozen (SIGSTOP) mid-training: the
# job must end with the watchdog's status (124) within the timeout plus a margin, rank 0's
# watchdog naming rank 1, its pid and that it is stopped. The timeout must follow one rule:
# --set parallel.collective_timeout_s over LOOM_COMM_TIMEOUT (which `loom launch --timeout`
# sets, replacing an inherited one) over the config; rank 0 prints which applies.
#   train_timeout_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_COMM_TIMEOUT
margin_s=10
# Marks every process this script starts (loom launch forwards LOOM_* to the ranks), so they
# can be found, and ended, by pid.
tag="train-timeout-$$-$RANDOM"
work=$(mktemp -d)

tagged_pids() {
  local e p
  for e in /proc/[0-9]*/environ; do
    if tr '\0' '\n' 2>/dev/null <"$e" | grep -qx "LOOM_TEST_TAG=$tag"; then
      p=${e#/proc/}
      echo "${p%/environ}"
    fi
  done
}
rank_pid() {  # the pid of rank $1's process
  local p
  for p in $(tagged_pids); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
cleanup() {
  local p
  for p in $(tagged_pids); do
    kill -CONT "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

"$loom" prepare --input "$src/data/tinyshakespeare/input.txt" --tokenizer byte --out "$work/data" \
  --force >/dev/null || fail "loom prepare failed"
# A tiny model that would train for a long time: steps take milliseconds, so the ranks are
# always near a collective.
tiny=(train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" --set model.preset=gpt2-tiny
      --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=4
      --set schedule.eval_interval=0 --set log.every=20 --set log.progress=off
      --set checkpoint.every_steps=0)
train=("${tiny[@]}" --set parallel.dp=2 --set schedule.steps=1000000)

# stall NAME TIMEOUT_S EXPECTED_TIMEOUT_LINE COMMAND...: runs COMMAND (a loom launch), stops
# rank 1 once steps are logged, and checks how the job ends.
stall() {
  local name=$1 timeout_s=$2 line=$3
  shift 3
  local out="$work/$name.out"
  echo "== $name"
  env LOOM_TEST_TAG="$tag" "$@" --set checkpoint.dir="$work/run-$name" \
    --set log.metrics_path="$work/$name.jsonl" >"$out" 2>&1 &
  local launcher=$! t0
  t0=$(ms)
  until grep -q '^\[rank 0\] step ' "$out"; do
    kill -0 "$launcher" 2>/dev/null || { cat "$out"; fail "$name: the job ended before training"; }
    [ $(( $(ms) - t0 )) -lt 60000 ] || { cat "$out"; fail "$name: no step logged within 60 s"; }
    sleep 0.1
  done
  local r0 r1
  r0=$(rank_pid 0)
  r1=$(rank_pid 1)
  [ -n "$r0" ] && [ -n "$r1" ] || fail "$name: cannot find the ranks' processes"
  # The board's shared-memory name is removed as soon as every rank has mapped it.
  ! ls /dev/shm/loom-progress-"$r0"-* >/dev/null 2>&1 || fail "$name: the progress board is left in /dev/shm"
  kill -STOP "$r1"
  t0=$(ms)
  while kill -0 "$launcher" 2>/dev/null && [ $(( $(ms) - t0 )) -lt $(( (timeout_s + margin_s) * 1000 )) ]; do
    sleep 0.1
  done
  local dt=$(( $(ms) - t0 ))
  kill -0 "$launcher" 2>/dev/null && { cat "$out"; fail "$name: the job still runs ${dt} ms after rank 1 stopped"; }
  wait "$launcher"
  local rc=$?
  grep -v '^\[rank 0\] step ' "$out"
  echo "$name: rc=$rc, ended ${dt} ms after rank 1 (pid $r1) stopped"
  [ "$rc" -eq 124 ] || fail "$name: exit status $rc, not the watchdog's 124"
  # The collective that hangs may have begun just before the stop.
  [ "$dt" -ge $(( timeout_s * 1000 - 1000 )) ] || fail "$name: ended before the ${timeout_s} s timeout"
  grep -qxF "[rank 0] $line" "$out" || fail "$name: no line '$line'"
  # Rank 1 is stopped between collectives (did not enter) or inside one.
  grep -qE '^\[rank 0\] \[watchdog\] rank 0: [a-z_]+ #[0-9]+ on group [a-z0-9.]+ \([^)]*\) has not completed after [0-9.]+ s; last completed: [a-z_]+ #[0-9]+\. (Rank 1 did not enter it \(its last: [a-z_]+ #[0-9]+; pid '"$r1"', stopped\)|Every rank entered it, but rank 1 is now stopped \(pid '"$r1"'\))\.$' "$out" \
    || fail "$name: no watchdog line naming rank 1 (pid $r1) as stopped"
  # mpirun wakes rank 1 (SIGCONT) to end it; its watchdog must not then blame the others.
  ! grep -q '^\[rank 1\] \[watchdog\]' "$out" || fail "$name: rank 1's watchdog fired after it was woken"
  for _ in $(seq 50); do
    [ -z "$(tagged_pids)" ] && break
    sleep 0.1
  done
  [ -z "$(tagged_pids)" ] || fail "$name: processes left behind: $(tagged_pids)"
}

# --timeout replaces an inherited LOOM_COMM_TIMEOUT.
stall launch-timeout 2 "[train] collective timeout 2 s (from LOOM_COMM_TIMEOUT)" \
  env LOOM_COMM_TIMEOUT=50 "$loom" launch --nproc 2 --timeout 2 -- "${train[@]}"
stall environment 2 "[train] collective timeout 2 s (from LOOM_COMM_TIMEOUT)" \
  env LOOM_COMM_TIMEOUT=2 "$loom" launch --nproc 2 -- "${train[@]}"
stall command-line 2 "[train] collective timeout 2 s (from --set parallel.collective_timeout_s)" \
  env LOOM_COMM_TIMEOUT=50 "$loom" launch --nproc 2 -- "${train[@]}" --set parallel.collective_timeout_s=2

echo "== config"
out=$("$loom" "${tiny[@]}" --set schedule.steps=1 --set checkpoint.dir="$work/run-config" \
      --set log.metrics_path="$work/config.jsonl" 2>&1) || { echo "$out"; fail "a 1-step run failed"; }
echo "$out" | grep -qxF "[train] collective timeout 600 s (from parallel.collective_timeout_s in the config)" \
  || { echo "$out"; fail "no line saying the config's 600 s applies"; }
out=$(LOOM_COMM_TIMEOUT=soon "$loom" "${tiny[@]}" --set schedule.steps=1 --set checkpoint.dir="$work/run-bad" 2>&1) \
  && fail "LOOM_COMM_TIMEOUT=soon was accepted"
echo "$out" | grep -qF '[comm] LOOM_COMM_TIMEOUT="soon" is not a number of seconds >= 0' \
  || { echo "$out"; fail "no error naming LOOM_COMM_TIMEOUT"; }
echo PASS
