# Shell helpers of the tests on the Slurm test cluster (they use `fail`, $tc, $src, $loom and
# $work from the test):
#   cluster_up N            testcluster.sh up N and its environment; exits 77 (skip) where the
#                           cluster cannot be made
#   prepare_text            200 kB of Tiny Shakespeare as byte tokens in $work/data
#   job_field JOB FIELD     one field of `scontrol show job` (JobState, Restarts, ExitCode)
#   wait_job JOB SECONDS    until the job ends; prints its final state. Polls every 0.1 s:
#                           sbatch --wait polls every few seconds, which would triple a test
#   nothing_left WHAT       no job in the queue and no process in the hosts but Slurm's
#                           daemons, within 5 s

cluster_up() {
  "$tc" up "$1"
  local rc=$?
  [ "$rc" -eq 77 ] && exit 77
  [ "$rc" -eq 0 ] || fail "testcluster.sh up $1 exited $rc"
  eval "$("$tc" env)"
}

prepare_text() {
  head -c 200000 "$src/data/tinyshakespeare/input.txt" >"$work/in.txt"
  "$loom" prepare --input "$work/in.txt" --tokenizer byte --out "$work/data" >/dev/null || fail "loom prepare failed"
}

job_field() {
  scontrol show job -o "$1" 2>/dev/null | grep -o " $2=[^ ]*" | cut -d= -f2
}

wait_job() {
  local state
  for _ in $(seq $(($2 * 10))); do
    state=$(job_field "$1" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state"
        return 0 ;;
    esac
    sleep 0.1
  done
  echo "still ${state:-unknown} after $2 s"
  {
    echo "-- job $1 after $2 s:"; scontrol show job "$1" 2>&1; squeue 2>&1; sinfo -N 2>&1
    echo "-- slurmctld.log:"; tail -n 15 /run/loom-testcluster/slurmctld.log 2>&1
  } >&2
  return 1
}

nothing_left() {
  local p ns left=""
  for _ in $(seq 50); do
    left=$(squeue -h -o '%i %T' 2>&1)
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^loomh[0-9]+$'); do
      for p in $(ip netns pids "$ns" 2>/dev/null); do
        case $(cat "/proc/$p/comm" 2>/dev/null) in
          slurmd | slurmctld | slurmscriptd | "") ;;
          *) left+=" $ns:$p:$(cat "/proc/$p/comm" 2>/dev/null)" ;;
        esac
      done
    done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  fail "$1 left running: $left"
}
