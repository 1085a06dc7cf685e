#!/usr/bin/env bash
# Runs one command and checks what CTest's PASS_REGULAR_EXPRESSION cannot: its exact exit
# status (a run that prints its SUMMARY and then fails must fail the test), then its output
# and the values on its SUMMARY line. Not a test harness: one command, checks, exit 0 or 1.
#
# usage: expect.sh STATUS [--has TEXT]... [--summary EXPR]... -- COMMAND [ARGS...]
#   STATUS          the exit status COMMAND must return: 0, or 2 for a usage error
#   --has TEXT      stdout and stderr together contain TEXT, compared literally
#   --summary EXPR  a Python expression over the last "SUMMARY {json}" line's keys (and `s`, the
#                   whole object) that must be true, e.g. "tokens_per_s > 0", "runs[0]['stages'] == 2"
set -uo pipefail
usage() { echo "usage: expect.sh STATUS [--has TEXT]... [--summary EXPR]... -- COMMAND [ARGS...]" >&2; exit 2; }
[ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || usage
want_status=$1
shift
has=()
summary=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --has) [ $# -ge 2 ] || usage; has+=("$2"); shift 2 ;;
    --summary) [ $# -ge 2 ] || usage; summary+=("$2"); shift 2 ;;
    *) usage ;;
  esac
done
[ $# -ge 2 ] || usage
shift  # the --

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
status=0
"$@" > "$out" 2>&1 || status=$?
cat "$out"
fail=0
if [ "$status" != "$want_status" ]; then
  echo "[expect] exit status $status, expected $want_status: $*"
  fail=1
fi
for text in "${has[@]}"; do
  grep -qF -- "$text" "$out" || { echo "[expect] the output lacks: $text"; fail=1; }
done
if [ ${#summary[@]} -gt 0 ]; then
  python3 - "$out" "${summary[@]}" <<'PY' || fail=1
import json, sys
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith("SUMMARY ")]
if not lines:
    sys.exit("[expect] no SUMMARY line in the output")
s = json.loads(lines[-1][len("SUMMARY "):])
bad = 0
for expr in sys.argv[2:]:
    try:
        ok = eval(expr, dict(s, s=s, __builtins__={"abs": abs, "all": all, "len": len, "min": min, "max": max, "sum": sum}))
    except Exception as e:  # a key the SUMMARY lacks reads as a failed check, naming the key
        ok, expr = False, f"{expr} ({type(e).__name__}: {e})"
    if not ok:
        print(f"[expect] SUMMARY check failed: {expr}")
        bad = 1
sys.exit(bad)
PY
fi
exit $fail
