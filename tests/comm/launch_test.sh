#!/usr/bin/env bash
# `loom launch` end to end: rank-prefixed output, a failing rank failing the job quickly
# (the waiting ranks are torn down), the watchdog timeout passed through --timeout, and
# `loom bench comm --nproc` relaunching itself.
#   launch_test.sh <loom> <comm_test_child>
set -u
loom=$1
child=$2
export OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "FAIL: $*"; exit 1; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

echo "== version on 2 ranks"
out=$("$loom" launch --nproc 2 -- version 2>&1) || fail "launch version exited $?: $out"
echo "$out"
for r in 0 1; do
  echo "$out" | grep -qx "\[rank $r\] loom 0.1.0" || fail "no '[rank $r] loom 0.1.0' line"
done

echo "== 3 ranks of another binary"
out=$(LOOM_LAUNCH_EXE=$child "$loom" launch --nproc 3 -- hello 2>&1) || fail "hello exited $?"
echo "$out"
echo "$out" | grep -qx "\[rank 2\] hello from rank 2 of 3" || fail "no hello from rank 2"

echo "== a failing rank fails the job"
t0=$(ms)
out=$(LOOM_LAUNCH_EXE=$child timeout 60 "$loom" launch --nproc 2 -- fail 2>&1)
rc=$?
dt=$(( $(ms) - t0 ))
echo "$out"
echo "rc=$rc after ${dt} ms"
[ "$rc" -ne 0 ] || fail "launch exited 0 although rank 1 failed"
[ "$dt" -lt 20000 ] || fail "the waiting rank was not torn down (${dt} ms)"
echo "$out" | grep -q "^\[rank 1\] error: \[child\] rank 1 fails on purpose" || fail "rank 1's error missing"

echo "== --timeout reaches the ranks' watchdog"
t0=$(ms)
out=$(LOOM_LAUNCH_EXE=$child timeout 60 "$loom" launch --nproc 2 --timeout 2 -- stall 2>&1)
rc=$?
dt=$(( $(ms) - t0 ))
echo "$out"
echo "rc=$rc after ${dt} ms"
[ "$rc" -ne 0 ] && [ "$dt" -lt 20000 ] || fail "the stalled job did not end in time"
echo "$out" | grep -q "^\[rank 0\] \[watchdog\] rank 0: all_reduce #2 on group world.* Rank 1 did not enter it" \
  || fail "no watchdog line naming rank 1"

echo "== bench comm --nproc relaunches itself"
out=$("$loom" bench comm --nproc 2 --ops all_reduce,all_to_all --min-bytes 1K --max-bytes 4K \
      --iters 2 --warmup 1 2>&1) || fail "bench comm exited $?: $out"
echo "$out"
last=$(echo "$out" | tail -n 1)
case $last in
  'SUMMARY {"bench":"comm","ranks":2,"backend":"mpi"'*'"wrong":0'*'"all_to_all":{"peak_busbw_gbps":'*) ;;
  *) fail "last line is not the 2-rank SUMMARY: $last" ;;
esac
[ "$(echo "$out" | grep -c '^\[rank 0\]   all_reduce ')" -eq 3 ] || fail "expected 3 all_reduce rows"
echo PASS
