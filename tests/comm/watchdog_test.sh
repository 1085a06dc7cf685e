#!/usr/bin/env bash
# The comm watchdog across processes: 3 ranks under mpiexec, the last one stalls or dies
# before all_reduce #2. The others must end the job (non-zero) within the 3 s timeout plus a
# margin, say which collective hung and name rank 2 as the one that did not enter it.
#   watchdog_test.sh stall|kill|mpirun-teardown <comm_test_child>
# kill: mpirun is told not to react to the death itself (as when a host vanishes), so only
# the watchdog can end the job. mpirun-teardown checks no watchdog: rank 2 dies and mpirun's
# own teardown must end the job, naming rank 2, with the watchdog's timeout set far out
# (30 s) so that it cannot be what ended it, and no watchdog line in the output.
set -u
mode=$1
child=$2
mpiexec=${MPIEXEC:-mpiexec}
timeout_s=3
margin_s=15
extra=()
child_mode=$mode
case $mode in
  stall) ;;
  kill) extra=(--mca orte_abort_on_non_zero_status 0) ;;
  mpirun-teardown) child_mode=kill timeout_s=30 ;;
  *) echo "watchdog_test.sh: mode '$mode' is not stall, kill or mpirun-teardown"; exit 2 ;;
esac
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
LOOM_COMM_TIMEOUT=$timeout_s timeout 60 "$mpiexec" -n 3 --oversubscribe --allow-run-as-root \
  --bind-to none "${extra[@]}" "$child" "$child_mode" >"$out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "mode=$mode rc=$rc elapsed=${elapsed_ms} ms"
cat "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$rc" -ne 124 ] || [ "$elapsed_ms" -lt 60000 ] || fail "the job hung until the test's timeout"
if [ "$mode" = mpirun-teardown ]; then
  [ "$elapsed_ms" -lt $(( timeout_s * 1000 )) ] || fail "took ${elapsed_ms} ms, past the watchdog's ${timeout_s} s"
  ! grep -q '^\[watchdog\]' "$out" || fail "the watchdog acted; mpirun's teardown was to end the job"
  grep -qE 'process rank 2 .* exited on signal 9' "$out" || fail "mpirun did not name rank 2's death"
else
  [ "$elapsed_ms" -lt $(( (timeout_s + margin_s) * 1000 )) ] || fail "took ${elapsed_ms} ms"
  [ "$elapsed_ms" -ge $(( timeout_s * 1000 )) ] || fail "ended before the watchdog timeout"
  # The stalled rank sleeps (running); the killed one is gone once mpirun has reaped it.
  state='running'
  [ "$mode" = kill ] && state='gone'
  grep -qE '^\[watchdog\] rank [01]: all_reduce #2 on group world \(4.00 MiB\) has not completed after [0-9.]+ s; last completed: all_reduce #1\. Rank 2 did not enter it \(its last: all_reduce #1; pid [0-9]+, '"$state"'\)\.$' "$out" \
    || fail "no watchdog line naming all_reduce #2 and rank 2"
fi
echo PASS
