#!/usr/bin/env bash
# scripts/testhosts.sh end to end: `up 2` makes two hosts that reach each other and nothing
# else, `list` names them, the agent runs commands inside a host under its own hostname,
# `loom launch --hosts` places ranks per host (shared memory inside a host, TCP between
# them, bytes on the veths), bad host lists are refused by name, and `down` leaves no
# namespace, veth, bridge or state file behind. Skips (77) when not root or iproute2 is missing.
#   testhosts_test.sh <loom> <source dir>
set -u
loom=$1
src=$2
th="$src/scripts/testhosts.sh"
export OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "FAIL: $*"; exit 1; }
# Everything this test made goes, however it ends.
trap '"$th" down >/dev/null 2>&1' EXIT

leftovers() {  # prints what `down` should have removed
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^loomh[0-9]+$'
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^(loombr0|veth-loomh[0-9]+)$'
  [ ! -e /run/loom-testhosts ] || echo /run/loom-testhosts
}

echo "== up 2 --link 1gbit"
out=$("$th" up 2 --link 1gbit 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "up exited $rc"
[ "$("$th" list)" = "$(printf 'loomh1\nloomh2')" ] || fail "list printed '$("$th" list)'"
ip netns exec loomh1 tc qdisc show dev eth0 | grep -q 'tbf 1: root .*rate 1Gbit' ||
  fail "loomh1's eth0 is not shaped: $(ip netns exec loomh1 tc qdisc show dev eth0)"

echo "== up 2 again: leftovers are removed first, no shaping this time"
"$th" up 2 || fail "a second up failed"
! ip netns exec loomh1 tc qdisc show dev eth0 | grep -q tbf || fail "the old shaping survived up"
for i in 1 2; do
  ip -n loomh$i -4 -br addr show eth0 | grep -q " 198\.18\.0\.1$i/24" || fail "loomh$i has no 198.18.0.1$i/24"
  ip -n loomh$i -br link show lo | grep -q UP || fail "lo is down on loomh$i"
  # Only the test network is reachable from a host: no default route out.
  routes=$(ip -n loomh$i -4 route show)
  [ "$(echo "$routes" | wc -l)" -eq 1 ] && [[ $routes == "198.18.0.0/24 dev eth0 "* ]] ||
    fail "loomh$i has other routes: $routes"
done

echo "== loomh1 reaches loomh2"
if command -v ping >/dev/null 2>&1; then
  ip netns exec loomh1 ping -c 1 -W 2 198.18.0.12 >/dev/null || fail "loomh1 cannot ping loomh2"
elif command -v python3 >/dev/null 2>&1; then
  # No ping here: a TCP connection from loomh1 to a listener on loomh2.
  ip netns exec loomh2 python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.18.0.12", 5999)); s.listen(1); s.settimeout(10)
c, a = s.accept(); print("loomh2 got", c.recv(64).decode().strip(), "from", a[0])' &
  listener=$!
  ok=0
  for _ in $(seq 50); do
    ip netns exec loomh1 bash -c 'echo hello >/dev/tcp/198.18.0.12/5999' 2>/dev/null && { ok=1; break; }
    sleep 0.1
  done
  wait "$listener"
  [ "$ok" -eq 1 ] || fail "loomh1 cannot connect to loomh2"
else
  echo "no ping or python3: the connection is checked by the MPI jobs below"
fi

echo "== the agent runs a command on a host, as ssh would"
[ "$("$th" agent -x -o BatchMode=yes loomh2 'echo $(hostname)' on '$(ip -4 -br addr show eth0 | tr -s " " | cut -d" " -f3)')" = \
  "loomh2 on 198.18.0.12/24" ] || fail "agent did not run on loomh2"
[ "$(hostname)" != loomh2 ] || fail "the agent changed this machine's hostname"
out=$("$th" agent loomh7 true 2>&1)
rc=$?
[ "$rc" -eq 255 ] && echo "$out" | grep -qF "no test host 'loomh7' (up: loomh1 loomh2)" ||
  fail "agent on a missing host: rc=$rc, '$out'"

echo "== ranks learn their host"
out=$(LOOM_LAUNCH_EXE=/bin/sh "$loom" launch --hosts loomh1:2,loomh2:2 -- \
      -c 'echo host=$(hostname) local=$OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE' 2>&1) ||
  fail "launch on the hosts failed: $out"
echo "$out"
for want in "[rank 0] host=loomh1 local=0/2" "[rank 1] host=loomh1 local=1/2" \
            "[rank 2] host=loomh2 local=0/2" "[rank 3] host=loomh2 local=1/2"; do
  echo "$out" | grep -qxF "$want" || fail "no line '$want'"
done

echo "== an all-reduce across the hosts goes over TCP on the veths"
rx0=$(cat /sys/class/net/veth-loomh2/statistics/rx_bytes)
out=$("$loom" launch --hosts loomh1:2,loomh2:2 -- bench comm --ops all_reduce --min-bytes 4M --max-bytes 4M \
      --iters 3 --warmup 1 2>&1) || fail "bench comm on the hosts failed: $out"
echo "$out" | tail -n 1
rx=$(( $(cat /sys/class/net/veth-loomh2/statistics/rx_bytes) - rx0 ))
echo "veth-loomh2 carried $rx bytes from loomh2"
# 5 all-reduces of 4 MiB (check, warm-up, 3 timed) send about 20 MiB from each host; the
# daemons' own traffic is a few KiB.
[ "$rx" -gt $(( 2 * 4 * 1024 * 1024 )) ] || fail "only $rx bytes crossed veth-loomh2"
echo "$out" | grep -q '"wrong":0' || fail "the all-reduce gave wrong results"

echo "== shared memory only inside a host"
mpi=(--mca plm_rsh_agent "$th agent" --allow-run-as-root --bind-to none --mca pml ob1 --mca btl "vader,self")
small=(bench comm --ops all_reduce --min-bytes 1K --max-bytes 1K --iters 1 --warmup 0)
out=$(timeout 60 mpirun -np 2 --host loomh1:2 "${mpi[@]}" "$loom" "${small[@]}" 2>&1) ||
  fail "2 ranks on loomh1 over vader,self failed: $out"
out=$(timeout 60 mpirun -np 2 --host loomh1:1,loomh2:1 "${mpi[@]}" "$loom" "${small[@]}" 2>&1) &&
  fail "ranks on two hosts talked over vader,self alone: $out"
echo "$out" | grep -q "unable to reach each other" || fail "no 'unable to reach' from mpirun: $out"

echo "== bad host lists are refused by name"
out=$("$loom" launch --hosts loomh1:2,loomh2:2 --nproc 6 -- version 2>&1) && fail "6 ranks on 4 slots accepted"
echo "$out" | grep -qF "[launch] --hosts loomh1:2,loomh2:2 has 4 slots but --nproc is 6" || fail "unclear: $out"
out=$("$loom" launch --hosts loomh1:2,loomh3:2 -- version 2>&1) && fail "loomh3 accepted"
echo "$out" | grep -qF "loomh3 is not up (test hosts up: loomh1 loomh2)" || fail "unclear: $out"
out=$("$loom" launch --hosts loomh1:2,loomh2:2 --dry-run -- version 2>&1)
echo "$out"
echo "$out" | grep -qF -- "--mca plm_rsh_agent '$(readlink -f "$th") agent' --mca pml ob1 --mca btl vader,tcp,self --mca btl_tcp_if_include 198.18.0.0/24 --mca oob_tcp_if_include 198.18.0.0/24" ||
  fail "the dry run lacks the test hosts' parameters"

echo "== up refuses more than 16 hosts and bad links, leaving nothing"
"$th" down
out=$("$th" up 17 2>&1) && fail "up 17 accepted"
echo "$out" | grep -qF "give 1 to 16 hosts" || fail "unclear: $out"
out=$("$th" up 2 --link fast 2>&1) && fail "--link fast accepted"
echo "$out" | grep -qF "rate 'fast' should look like" || fail "unclear: $out"
if ! out=$("$th" up 2 --link 1gbit,0.5ms 2>&1); then
  echo "$out"
  echo "$out" | grep -qF "needs tc's netem qdisc" || fail "the delay failed without naming netem: $out"
else
  ip netns exec loomh2 tc qdisc show dev eth0 | grep -q 'netem 1: root .*delay 500us' || fail "no netem delay"
  ip netns exec loomh2 tc qdisc show dev eth0 | grep -q 'tbf 10: parent 1:1 .*rate 1Gbit' || fail "no tbf below netem"
  "$th" down
fi
[ -z "$(leftovers)" ] || fail "left after a refused up: $(leftovers)"

echo "== without root: skip"
if command -v setpriv >/dev/null 2>&1; then
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$th" up 2 2>&1)
  rc=$?
  [ "$rc" -eq 77 ] && echo "$out" | grep -qF "needs root" || fail "as nobody: rc=$rc, '$out'"
fi

echo "== up, then down twice: nothing left"
"$th" up 2 >/dev/null || fail "up failed"
"$th" down || fail "down failed"
"$th" down || fail "a second down failed"
[ -z "$(leftovers)" ] || fail "left after down: $(leftovers)"
[ -z "$("$th" list)" ] || fail "list still names hosts"
out=$("$loom" launch --hosts loomh1:2,loomh2:2 -- version 2>&1) && fail "launch on hosts that are down succeeded"
echo "$out" | grep -qF "which look like test hosts, but none are up" || fail "unclear: $out"
echo PASS
