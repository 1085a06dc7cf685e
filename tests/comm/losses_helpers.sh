# Shell helpers of the tests that hold a multi-rank run's losses against the single process
# (sourced; they use `fail` from the test):
#   losses METRICS.jsonl                  one loss per logged step, in order
#   losses_equal ONE.jsonl RUN.jsonl N WHAT
#                                         N steps in both, each loss within 1e-5 relative of the
#                                         single process's: the tolerance of the dp equivalence
#                                         tests (tests/parallel/mpi/dp_equivalence_test.cpp)

losses() {
  grep -o '"loss":[^,}]*' "$1" | cut -d: -f2
}

losses_equal() {
  paste -d' ' <(losses "$1") <(losses "$2") | awk -v what="$4" -v steps="$3" '
    NF != 2 { print "FAIL: step " NR ": a loss is missing"; bad = 1; next }
    {
      d = $1 - $2; if (d < 0) d = -d
      rel = d / ($1 < 0 ? -$1 : $1)
      if (rel > worst) worst = rel
      if (rel > 1e-5) { printf "FAIL: step %d: one process %s, %s %s (relative %.2g)\n", NR, $1, what, $2, rel; bad = 1 }
    }
    END {
      if (NR != steps) { print "FAIL: " NR " steps compared, not " steps; bad = 1 }
      printf "%s: %d steps, largest relative loss difference %.2g (tolerance 1e-5)\n", what, NR, worst
      exit bad
    }'
}
