#!/usr/bin/env bash
# `loom bench comm --algorithms` and `--calibrate`, and `loom bench train` with 1-bit Adam,
# end to end on 4 ranks made into 2 "hosts" (LOOM_COMM_RANKS_PER_HOST=2): every algorithm's
# results check out, auto names its picks, the calibration file loads back into a run, and
# 1-bit Adam sends under a tenth of AdamW's gradient bytes.
#   bench_algorithms_test.sh <loom>
set -u
loom=$1
export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 LOOM_COMM_RANKS_PER_HOST=2
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== bench comm --algorithms"
out=$("$loom" bench comm --nproc 4 --algorithms ring,tree,hierarchical,auto,mpi --ops all_reduce,reduce_scatter,all_gather \
      --min-bytes 4K --max-bytes 64K --iters 2 --warmup 1 2>&1) || fail "bench comm exited $?: $out"
echo "$out" | tail -n 4
last=$(echo "$out" | tail -n 1)
case $last in
  'SUMMARY {"bench":"comm","ranks":4,'*'"wrong":0'*'"hosts":2,"algorithms":{'*'"hierarchical_over_ring":'*'"auto_max_slowdown":'*'"auto_picks":{"all_gather":"4K:'*) ;;
  *) fail "last line is not the algorithms SUMMARY: $last" ;;
esac
[ "$(echo "$out" | grep -c '^\[rank 0\]   reduce_scatter hierarchical ')" -eq 5 ] || fail "expected 5 hierarchical reduce_scatter rows"
echo "$out" | grep -q '^\[rank 0\]   all_reduce     auto:' || fail "auto rows do not name their pick"

echo "== bench comm --calibrate, then a run that loads it"
out=$("$loom" bench comm --nproc 4 --calibrate "$tmp/cal.txt" --min-bytes 4K --max-bytes 16K --iters 2 2>&1) \
  || fail "calibrate exited $?: $out"
echo "$out" | tail -n 1 | grep -q '^SUMMARY {"bench":"comm_calibrate","ranks":4,"hosts":2,' || fail "no calibrate SUMMARY"
for line in '^inter_gbps ' '^time mpi all_reduce 4 2 4096 ' '^time hierarchical reduce_scatter 4 2 16384 ' '^time tree all_gather 4 2 8192 '; do
  grep -q "$line" "$tmp/cal.txt" || { cat "$tmp/cal.txt"; fail "calibration file has no line matching $line"; }
done
out=$(LOOM_COMM_CALIBRATION="$tmp/cal.txt" "$loom" bench comm --nproc 4 --algorithms auto --ops all_reduce \
      --min-bytes 4K --max-bytes 4K --iters 1 --warmup 0 2>&1) || fail "run with the calibration exited $?: $out"
echo "$out" | grep -q "cost model: $tmp/cal.txt" || fail "the run did not load the calibration: $out"
echo "bad_key 1" > "$tmp/bad.txt"
out=$(LOOM_COMM_CALIBRATION="$tmp/bad.txt" "$loom" bench comm --nproc 2 --ops all_reduce --max-bytes 1K 2>&1) \
  && fail "a malformed calibration file was accepted"
echo "$out" | grep -q "bad.txt:1: unknown key 'bad_key'" || fail "the error does not name the line: $out"

echo "== bench train: 1-bit Adam's bytes against AdamW's"
bytes() { echo "$1" | tail -n 1 | sed -n 's/.*"wire_bytes_per_rank":\([0-9.e+]*\).*/\1/p'; }
adam=$("$loom" bench train --nproc 2 --dp 2 --model gpt2-tiny --batch 2 --seq 32 --steps 2 --warmup 1 --threads 1 2>&1) \
  || fail "bench train adamw exited $?: $adam"
onebit=$("$loom" bench train --nproc 2 --dp 2 --model gpt2-tiny --batch 2 --seq 32 --steps 2 --warmup 1 --threads 1 \
         --optim onebit_adam 2>&1) || fail "bench train onebit exited $?: $onebit"
a=$(bytes "$adam"); o=$(bytes "$onebit")
echo "wire bytes per rank and step: AdamW $a, 1-bit Adam $o"
[ -n "$a" ] && [ -n "$o" ] || fail "no wire_bytes_per_rank in the SUMMARY lines"
awk -v a="$a" -v o="$o" 'BEGIN { exit !(a > 0 && o > 0 && o <= 0.1 * a) }' || fail "1-bit Adam sent $o bytes, AdamW $a"
echo PASS
