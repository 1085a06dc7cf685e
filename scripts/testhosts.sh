#!/usr/bin/env bash
# Test hosts on one machine: network namespaces loomh1..loomhN joined by a bridge, each with
# its own address and (through the agent) its own hostname, so mpirun sees N nodes and
# `loom launch --hosts loomh1:2,loomh2:2` runs a multi-host job here (docs/DISTRIBUTED.md,
# "Several hosts"). The hosts share this machine's files and processes: they are a network
# topology for tests, not containers.
#
#   testhosts.sh up N [--link RATE[,DELAY]]  create N hosts (N <= 16), removing leftovers first;
#                                            --link shapes each host's outgoing link with tc,
#                                            e.g. 1gbit or 1gbit,0.5ms (one-way delay, netem)
#   testhosts.sh down                        remove everything `up` made; safe to repeat
#   testhosts.sh list                        the hosts that are up, one per line
#   testhosts.sh agent [ssh options] HOST [command...]
#                                            mpirun's plm_rsh_agent: runs the command like
#                                            ssh would (joined into one shell command) inside
#                                            HOST with hostname HOST; no command: a shell
#
# Addresses come from the benchmarking range 198.18.0.0/15 only: the bridge loombr0 is
# 198.18.0.1/24, host i is 198.18.0.(10+i)/24 on its eth0; its peer in this namespace is
# veth-loomhI. Nothing else (routes, firewall, sysctls, /etc/hosts) is changed: mpirun reaches
# the hosts by address, so their names need not resolve. `up` writes the state file that
# `loom launch` reads to recognise test hosts.
# Exit status 77 (a skipped test) when not root or ip/tc/unshare are missing.
set -uo pipefail

readonly PREFIX=loomh
readonly BRIDGE=loombr0
readonly SUBNET=198.18.0.0/24
readonly BRIDGE_ADDR=198.18.0.1/24
readonly MAX_HOSTS=16
readonly STATE_DIR=/run/loom-testhosts
readonly STATE_FILE=$STATE_DIR/state

die() { echo "[testhosts] $*" >&2; exit 1; }
skip() { echo "[testhosts] $*" >&2; exit 77; }

host_addr() { echo "198.18.0.$((10 + $1))"; }

need_tools() {  # tool...
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 ||
      skip "needs '$t' (packages iproute2 for ip and tc, util-linux for unshare); install it or skip"
  done
}

need_root() {
  [ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces and a bridge; run as root (CI does) or skip"
}

# Test hosts that exist now, sorted by number: namespaces named loomh<digits>.
existing_hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" | sort -V
}

kill_host_processes() {  # ns: ends what still runs in it (ranks and orted left by a failed job)
  local ns=$1 pids p
  pids=$(ip netns pids "$ns" 2>/dev/null) || return 0
  [ -n "$pids" ] || return 0
  for p in $pids; do kill -TERM "$p" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null; done
}

cmd_down() {
  need_root
  need_tools ip
  local ns link
  for ns in $(existing_hosts); do
    kill_host_processes "$ns"
    ip netns del "$ns" 2>/dev/null
  done
  # Deleting a namespace deletes its veth end, and with it the peer; remove stragglers too.
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
                grep -E "^veth-${PREFIX}[0-9]+$"); do
    ip link del "$link" 2>/dev/null
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" || die "cannot delete bridge $BRIDGE"
  fi
  rm -rf "$STATE_DIR"
  [ -z "$(existing_hosts)" ] || die "namespaces left after down: $(existing_hosts | tr '\n' ' ')"
  return 0
}

# --link RATE[,DELAY]: RATE as tc writes it (100mbit, 1gbit, 10gbit), DELAY 500us, 0.5ms, 2ms.
parse_link() {
  local spec=$1
  link_rate=${spec%%,*}
  link_delay=
  [ "$spec" = "$link_rate" ] || link_delay=${spec#*,}
  [[ $link_rate =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] ||
    die "--link $spec: rate '$link_rate' should look like 100mbit, 1gbit or 10gbit"
  [ -z "$link_delay" ] || [[ $link_delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] ||
    die "--link $spec: delay '$link_delay' should look like 500us or 0.5ms"
}

# Shapes host ns's eth0 (its outgoing traffic, so a message between two hosts crosses one
# shaper and one delay): tbf for the rate; with a delay, netem at the root and tbf below it.
shape_link() {  # ns
  local ns=$1 tbf=(tbf rate "$link_rate" burst 256kb latency 50ms) err
  if [ -z "$link_delay" ]; then
    err=$(ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: "${tbf[@]}" 2>&1) ||
      { echo "[testhosts] tc tbf on $ns: $err" >&2; return 1; }
    return 0
  fi
  err=$(ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem delay "$link_delay" 2>&1) || {
    echo "[testhosts] --link delay $link_delay needs tc's netem qdisc, which this kernel lacks" \
         "($err); give only a rate (--link $link_rate) or load sch_netem" >&2
    return 1
  }
  err=$(ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: "${tbf[@]}" 2>&1) ||
    { echo "[testhosts] tc tbf under netem on $ns: $err" >&2; return 1; }
}

cmd_up() {
  local n=${1:-}
  shift || true
  [[ $n =~ ^[0-9]+$ ]] || die "usage: testhosts.sh up N [--link RATE[,DELAY]] (N hosts, 1-$MAX_HOSTS)"
  [ "$n" -ge 1 ] && [ "$n" -le "$MAX_HOSTS" ] || die "up $n: give 1 to $MAX_HOSTS hosts"
  link_rate='' link_delay=''
  while [ $# -gt 0 ]; do
    case $1 in
      --link) [ $# -ge 2 ] || die "--link needs RATE[,DELAY], e.g. --link 1gbit,0.5ms"; parse_link "$2"; shift 2 ;;
      --link=*) parse_link "${1#--link=}"; shift ;;
      *) die "up: unknown argument '$1'; usage: testhosts.sh up N [--link RATE[,DELAY]]" ;;
    esac
  done
  need_root
  need_tools ip tc unshare
  local self
  self=$(readlink -f "${BASH_SOURCE[0]}")
  [[ $self != *[[:space:]]* ]] || die "the path $self contains white space, which mpirun's agent setting cannot hold; move the checkout"
  cmd_down
  # Refuse to shadow a route someone else owns (another bridge or VPN in this range).
  if [ -n "$(ip -4 route show "$SUBNET" 2>/dev/null)" ]; then
    die "$SUBNET is already routed here ($(ip -4 route show "$SUBNET" | head -n1)); test hosts need it to themselves"
  fi
  # From here on, any failure removes what was made.
  trap 'cmd_down >/dev/null 2>&1' EXIT
  local err
  err=$(ip link add "$BRIDGE" type bridge 2>&1) ||
    skip "cannot create bridge $BRIDGE ($err): this environment does not allow network namespaces; skip"
  ip addr add "$BRIDGE_ADDR" dev "$BRIDGE" && ip link set "$BRIDGE" up || die "cannot configure bridge $BRIDGE"
  local i ns hosts=()
  for i in $(seq 1 "$n"); do
    ns=$PREFIX$i
    err=$(ip netns add "$ns" 2>&1) || skip "cannot create network namespace $ns ($err); skip"
    ip link add "veth-$ns" type veth peer name eth0 netns "$ns" &&
      ip link set "veth-$ns" master "$BRIDGE" up &&
      ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up || die "cannot wire host $ns"
    if [ -n "$link_rate" ]; then shape_link "$ns" || exit 1; fi
    hosts+=("$ns")
  done
  mkdir -p "$STATE_DIR"
  cat >"$STATE_FILE" <<EOF
# Written by scripts/testhosts.sh up, removed by down; read by loom launch.
hosts=${hosts[*]}
agent=$self agent
net=$SUBNET
link=${link_rate}${link_delay:+,$link_delay}
EOF
  trap - EXIT
  # br_netfilter sends bridged packets through iptables' FORWARD chain; a DROP policy there
  # (Docker sets one) would cut the hosts off from each other. Say so rather than change it.
  if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] &&
     command -v iptables >/dev/null 2>&1 && iptables -S FORWARD 2>/dev/null | grep -qx -- '-P FORWARD DROP'; then
    echo "[testhosts] warning: iptables' FORWARD policy is DROP and bridged traffic passes iptables" \
         "(net.bridge.bridge-nf-call-iptables=1): the hosts may not reach each other" >&2
  fi
  echo "[testhosts] up: ${hosts[*]} on $BRIDGE ($SUBNET)${link_rate:+, links shaped to $link_rate${link_delay:+ + $link_delay}}"
}

cmd_list() {
  command -v ip >/dev/null 2>&1 || return 0
  existing_hosts
}

# ssh's options that take a value; the others are single flags (-x, -q, -T, -4 ...).
cmd_agent() {
  while [ $# -gt 0 ]; do
    case $1 in
      -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || die "agent: usage: testhosts.sh agent [ssh options] HOST [command...]"
  local host=${1#*@} t up
  shift
  # 255 is what ssh returns when it cannot reach the host.
  for t in ip unshare; do
    command -v "$t" >/dev/null 2>&1 ||
      { echo "[testhosts] agent: needs '$t' (iproute2, util-linux) to enter host $host" >&2; exit 255; }
  done
  if [ ! -e "/run/netns/$host" ] || [[ ! $host =~ ^${PREFIX}[0-9]+$ ]]; then
    up=$(existing_hosts | tr '\n' ' ' | sed 's/ $//')
    [ -n "$up" ] && up="up: $up" || up="none are up"
    echo "[testhosts] agent: no test host '$host' ($up);" \
         "scripts/testhosts.sh up N creates loomh1..loomhN" >&2
    exit 255
  fi
  # Like ssh: the arguments form one command line for the remote shell.
  local script='hostname "$0" || exit 255; exec "${SHELL:-/bin/sh}" -i'
  [ $# -eq 0 ] || script='hostname "$0" || exit 255; exec /bin/sh -c "$1"'
  exec ip netns exec "$host" unshare --uts /bin/sh -c "$script" "$host" "$*"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; [ $# -eq 0 ] || die "down takes no arguments"; cmd_down ;;
  list) cmd_list ;;
  agent) shift; cmd_agent "$@" ;;
  -h|--help|help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
  *) die "usage: testhosts.sh up N [--link RATE[,DELAY]] | down | list | agent [ssh options] HOST command..." ;;
esac
