#!/usr/bin/env bash
# A Slurm cluster on one machine for tests: the namespace hosts of scripts/testhosts.sh
# (loomh1..N, 198.18.0.0/24) each run a slurmd under their own host name, loomh1 also runs
# slurmctld, and one munged authenticates them all. It is a real Slurm 22.05 (Debian's
# slurm-wlm): sbatch, srun --mpi=pmix and requeue work as on a cluster, but the hosts share
# this machine's files, so any directory is "shared storage". Not a container: jobs run as
# the submitting user on this machine's files.
#
#   testcluster.sh up N     N hosts (1-16), controller on loomh1; removes leftovers first;
#                           installs munge and Slurm with scripts/install-deps.sh --slurm
#                           when they are missing
#   testcluster.sh down     stops every daemon and job, removes the hosts and the state
#                           directory; safe to repeat
#   testcluster.sh status   the daemons that run and sinfo's view of the nodes; exit status
#                           0 when all run, 1 when one does not, 3 when the cluster is down
#   testcluster.sh env      the line to eval for Slurm's commands: export SLURM_CONF=...
#
# Everything lives in /run/loom-testcluster: slurm.conf (no cgroups: proctrack/linuxproc,
# task/none; no accounting), the munge key and socket, controller state, node spools and
# every daemon's log. No system file (/etc/slurm, /etc/munge) is read or changed, and no
# address outside 198.18.0.0/15 is used. Exit status 77 (a skipped test) when not root or
# network namespaces cannot be made; 1 with the reason on any other failure, after removing
# what it made (LOOM_TESTCLUSTER_KEEP=1 keeps it, logs included, to look at).
set -uo pipefail

readonly DIR=/run/loom-testcluster
readonly CONF=$DIR/slurm.conf
readonly MUNGE_DIR=$DIR/munge
readonly MUNGE_SOCKET=$MUNGE_DIR/munge.socket
readonly MAX_HOSTS=16
readonly CPUS_PER_NODE=4  # slots per node; more than the cores here is fine (config_overrides)

self_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly TESTHOSTS=$self_dir/testhosts.sh
readonly INSTALL_DEPS=$self_dir/install-deps.sh

die() { echo "[testcluster] $*" >&2; exit 1; }
skip() { echo "[testcluster] $*" >&2; exit 77; }
say() { echo "[testcluster] $*"; }

host_addr() { echo "198.18.0.$((10 + $1))"; }

need_root() {
  [ "$(id -u)" -eq 0 ] || skip "needs root to make namespace hosts and run Slurm's daemons; run as root (CI does) or skip"
}

# The programs the cluster runs; missing ones are installed (Debian), or named.
need_slurm() {
  local t missing=()
  for t in munged slurmctld slurmd sbatch srun sinfo scontrol; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  # srun --mpi=pmix's plugin (Debian: slurm-wlm-basic-plugins)
  [ -n "$(find /usr/lib /usr/lib64 /usr/local/lib -path '*slurm*' -name mpi_pmix.so 2>/dev/null | head -n1)" ] ||
    missing+=(mpi_pmix.so)
  [ ${#missing[@]} -eq 0 ] && return 0
  if command -v apt-get >/dev/null 2>&1 && [ -f "$INSTALL_DEPS" ]; then
    say "missing ${missing[*]}: installing Debian's munge and Slurm (scripts/install-deps.sh --slurm)"
    bash "$INSTALL_DEPS" --slurm >&2 ||
      die "could not install munge and Slurm; install the Debian packages munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins"
    for t in munged slurmctld slurmd sbatch srun sinfo scontrol; do
      command -v "$t" >/dev/null 2>&1 || die "'$t' is still missing after installing; install Slurm 22.05 or later with munge"
    done
    return 0
  fi
  die "missing ${missing[*]}: install munge and Slurm (Debian: munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins)"
}

pid_alive() {  # pidfile
  local pid
  [ -r "$1" ] && pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null
}

stop_pidfile() {  # pidfile name: TERM, then KILL after 5 s
  local f=$1 pid
  [ -r "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null)
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
}

cmd_down() {
  need_root
  local f
  # Node daemons first (their job steps go with the namespaces below), then the controller,
  # then munge, which the others needed to say goodbye.
  for f in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid "$MUNGE_DIR"/munged.pid; do
    [ -e "$f" ] && stop_pidfile "$f"
  done
  # Ends whatever still runs in the namespaces (job steps, ranks), then removes them.
  bash "$TESTHOSTS" down >/dev/null || die "scripts/testhosts.sh down failed"
  rm -rf "$DIR"
  return 0
}

write_conf() {  # n
  local n=$1 i
  cat >"$CONF" <<EOF
# Written by scripts/testcluster.sh up $n, removed by down. Slurm 22.05.
ClusterName=loomtest
SlurmctldHost=loomh1($(host_addr 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: job step credentials live 10 s, not 120, which is also how long a requeued
# job waits before it may start again.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool-%n
# Each node's own temporary directory: srun --mpi=pmix makes its clients' directory there
# under a name without the node's, which two nodes sharing one /tmp would both claim.
TmpFS=$DIR/tmp-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes are tracked by their parentage, tasks are not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# A pass over the queue every second (not every 60): a requeued job starts once it may.
SchedulerParameters=sched_interval=1
# What a site without a default has: srun must be told --mpi=pmix.
MpiDefault=none
# The node entries below are the truth, whatever the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
# Fast enough for tests: a dead node is noticed in seconds, a requeued job starts at once.
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=600
JobRequeue=1
EOF
  for i in $(seq 1 "$n"); do
    echo "NodeName=loomh$i NodeHostname=loomh$i NodeAddr=$(host_addr "$i") CPUs=$CPUS_PER_NODE State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=loom Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
}

start_munge() {
  mkdir -p "$MUNGE_DIR"
  chmod 755 "$MUNGE_DIR"
  (umask 077 && head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key") || die "cannot write a munge key"
  local err
  # --origin: the address munge writes into credentials, given so that munged does not look
  # up this machine's name (which may go to DNS); nothing checks it here.
  err=$(munged --force --origin=127.0.0.1 --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" 2>&1) || die "munged did not start: $err"
  for _ in $(seq 50); do
    [ -S "$MUNGE_SOCKET" ] && return 0
    sleep 0.1
  done
  die "munged made no socket $MUNGE_SOCKET (log: $(tail -n 3 "$MUNGE_DIR/munged.log" 2>/dev/null))"
}

# Runs a daemon inside host's network namespace under its host name (a UTS namespace of its
# own); the daemon forks into the background, keeping both. nsenter rather than `ip netns
# exec`, which mounts a fresh /sys and so hides /sys/fs/cgroup, without which Slurm 22.05's
# slurmd refuses to start even when no cgroup plugin is configured.
start_in_host() {  # host command...
  local host=$1
  shift
  nsenter --net="/run/netns/$host" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

wait_nodes_idle() {  # n: every node idle within 30 s
  local n=$1 idle=0
  for _ in $(seq 300); do
    idle=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    [ "$idle" -eq "$n" ] && return 0
    sleep 0.1
  done
  SLURM_CONF=$CONF sinfo -N 2>&1 | sed 's/^/  /' >&2
  die "only $idle of $n nodes became idle in 30 s (logs: $DIR/slurmctld.log, $DIR/slurmd-loomh*.log)"
}

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le "$MAX_HOSTS" ] ||
    die "usage: testcluster.sh up N (N hosts, 1-$MAX_HOSTS)"
  need_root
  need_slurm
  cmd_down
  # From here on, any failure removes what was made.
  [ -n "${LOOM_TESTCLUSTER_KEEP:-}" ] || trap 'cmd_down >/dev/null 2>&1' EXIT
  local rc
  bash "$TESTHOSTS" up "$n" >/dev/null
  rc=$?
  [ "$rc" -eq 77 ] && { trap - EXIT; cmd_down >/dev/null 2>&1; skip "no namespace hosts here (scripts/testhosts.sh up $n skipped)"; }
  [ "$rc" -eq 0 ] || die "scripts/testhosts.sh up $n failed"
  mkdir -p "$DIR/ctld" || die "cannot create $DIR"
  write_conf "$n"
  start_munge
  local err i
  err=$(start_in_host loomh1 slurmctld -c -f "$CONF" 2>&1) || die "slurmctld did not start: $err"
  for i in $(seq 1 "$n"); do
    mkdir -p "$DIR/spool-loomh$i" "$DIR/tmp-loomh$i"
    err=$(start_in_host "loomh$i" slurmd -N "loomh$i" -f "$CONF" 2>&1) || die "slurmd on loomh$i did not start: $err"
  done
  wait_nodes_idle "$n"
  trap - EXIT
  say "up: $n nodes loomh1..loomh$n, controller on loomh1; for Slurm's commands: export SLURM_CONF=$CONF"
}

cmd_status() {
  if [ ! -e "$CONF" ]; then
    echo "[testcluster] down"
    return 3
  fi
  local f name ok=0
  for f in "$MUNGE_DIR/munged.pid" "$DIR/slurmctld.pid" "$DIR"/slurmd-*.pid; do
    name=$(basename "$f" .pid)
    if pid_alive "$f"; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: not running"; ok=1; fi
  done
  SLURM_CONF=$CONF sinfo -N -o '%N %t %c %P' 2>&1
  return $ok
}

case ${1:-} in
  up) shift; [ $# -eq 1 ] || die "usage: testcluster.sh up N"; cmd_up "$1" ;;
  down) shift; [ $# -eq 0 ] || die "down takes no arguments"; cmd_down ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  -h|--help|help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
  *) die "usage: testcluster.sh up N | down | status | env" ;;
esac
