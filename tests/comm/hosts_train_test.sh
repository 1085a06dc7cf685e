#!/usr/bin/env bash
# `loom train` across two test hosts (scripts/testhosts.sh), 2 ranks on each of loomh1 and
# loomh2 (shared memory inside a host, TCP between them): dp=4 with ZeRO 0 and 3, and tp=2 x
# dp=2 with tp inside the hosts and, by parallel.order, across them (which must warn), must
# log the single-process run's loss at every step, to the 1e-5 relative tolerance of the dp
# equivalence tests (tests/parallel/mpi/dp_equivalence_test.cpp). Skips (77) when test
# hosts cannot be made here (not root, iproute2 missing).
#   hosts_train_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
th="$src/scripts/testhosts.sh"
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
unset LOOM_COMM_TIMEOUT
work=$(mktemp -d)
trap '"$th" down >/dev/null 2>&1; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$src/tests/comm/losses_helpers.sh"

"$th" up 2
rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "testhosts.sh up 2 exited $rc"

head -c 200000 "$src/data/tinyshakespeare/input.txt" >"$work/in.txt"
"$loom" prepare --input "$work/in.txt" --tokenizer byte --out "$work/data" >/dev/null || fail "loom prepare failed"
# Every step is logged to the metrics file with the loss at full precision.
tiny=(train "$src/configs/shakespeare.yaml" --set data.dir="$work/data" --set model.preset=gpt2-tiny
      --set model.vocab_size=256 --set data.seq_len=32 --set data.batch_size=8 --set schedule.steps=12
      --set schedule.warmup_steps=2 --set schedule.eval_interval=0 --set log.every=1
      --set log.progress=off --set checkpoint.every_steps=0)

echo "== one process"
"$loom" "${tiny[@]}" --set checkpoint.dir="$work/one" --set log.metrics_path="$work/one.jsonl" \
  >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "the single-process run failed"; }
[ "$(losses "$work/one.jsonl" | wc -l)" -eq 12 ] || fail "the single-process run logged no 12 losses"

# Layouts: dp=4 with ZeRO 0 and 3; tp=2 x dp=2 with tp inside each host (the default order)
# and with tp across the hosts (parallel.order tp,pp,ep,dp), which must warn.
for layout in "0 dp=4" "3 dp=4" "0 tp=2 dp=2" "0 tp=2 dp=2 order=tp,pp,ep,dp"; do
  set -- $layout
  zero=$1; shift
  sets=(); for kv in "$@"; do sets+=(--set "parallel.$kv"); done
  name=$(echo "$layout" | sed 's/[ =,]/_/g')
  echo "== $* on loomh1:2,loomh2:2, ZeRO-$zero"
  out="$work/run-$name"
  "$loom" launch --hosts loomh1:2,loomh2:2 --timeout 60 -- "${tiny[@]}" "${sets[@]}" \
    --set parallel.zero_stage=$zero --set checkpoint.dir="$out" --set log.metrics_path="$out.jsonl" \
    >"$out.log" 2>&1 || { cat "$out.log"; fail "$* ZeRO-$zero across the hosts failed"; }
  grep -q '^\[rank 0\] \[train\] 4 ranks on 2 hosts; collectives: ' "$out.log" || { cat "$out.log"; fail "no hosts line"; }
  if [ "${*: -1}" = "order=tp,pp,ep,dp" ]; then
    grep -q '^\[rank 0\] \[train\] warning: the tp group of rank 0 spans 2 hosts' "$out.log" \
      || { cat "$out.log"; fail "tp across the hosts did not warn"; }
  elif grep -q 'warning: the tp group' "$out.log"; then
    cat "$out.log"; fail "tp inside the hosts warned"
  fi
  grep -E '^\[rank 0\] step +12/12 ' "$out.log" || { cat "$out.log"; fail "rank 0 logged no step 12"; }
  losses_equal "$work/one.jsonl" "$out.jsonl" 12 "$* ZeRO-$zero" || fail "$* ZeRO-$zero losses differ from the single process"
done
echo PASS
