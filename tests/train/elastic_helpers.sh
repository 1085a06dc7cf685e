# Shell helpers of the elastic-launch tests (sourced; they use `fail` from the test):
#   strike_ranks OUT TAG STEPS VICTIM...  kills rank VICTIM of the job tagged TAG (LOOM_TEST_TAG in
#       its environment) once its output OUT shows step i*STEPS, for the i-th victim, and waits
#       until the launcher says the job trains again;
#   losses_match REF.jsonl RUN.jsonl      every step logged in both, losses within 1e-3 relative;
#   kill_tagged TAG                       SIGKILL to every process of the job (a stopped one too).

kill_tagged() {
  for p in $(grep -l "LOOM_TEST_TAG=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do kill -9 "$p" 2>/dev/null; done
}

rank_pid() {  # pid of rank $2 of the job tagged $1, or nothing
  for e in $(grep -l "LOOM_TEST_TAG=$1" /proc/[0-9]*/environ 2>/dev/null); do
    tr '\0' '\n' < "$e" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$e" | cut -d/ -f3; return; }
  done
}

strike_ranks() {
  local out=$1 tag=$2 every=$3 n=0 s p
  shift 3
  for victim in "$@"; do
    n=$((n + 1))
    for _ in $(seq 900); do
      s=$(grep -o '^\[rank 0\] step *[0-9]*' "$out" | tail -1 | grep -o '[0-9]*$')
      [ -n "$s" ] && [ "$s" -ge $((n * every)) ] && break
      sleep 0.1
    done
    p=$(rank_pid "$tag" "$victim")
    [ -n "$p" ] || { tail -20 "$out"; fail "no rank $victim to kill at step ${s:-?}"; }
    kill -9 "$p"
    for _ in $(seq 900); do [ "$(grep -c 'was training again' "$out")" -ge "$n" ] && break; sleep 0.1; done
  done
}

losses_match() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if "loss" in j and "step" in j: out[j["step"]] = j["loss"]
    return out
ref, run = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(run[s] - ref[s]) / ref[s] for s in ref if s in run)
print(f"losses of {len(run)} steps: worst relative difference {worst:.2e} against the uninterrupted run")
sys.exit(0 if len(run) == len(ref) and worst < 1e-3 else 1)
PY
}
