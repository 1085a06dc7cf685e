// Cross-rank agreement for checkpoints (checkpoint_agreement.h): one failure fails every rank,
// and a collective search for the newest valid checkpoint agrees on each candidate.
#include "loom/train/checkpoint_agreement.h"

#include <cstdio>

namespace loom::train {

int first_failing_rank(const comm::Group& g, bool ok) {
  if (g.size() == 1) return ok ? -1 : 0;
  Tensor r = Tensor::zeros({1}, DType::f64, MemCategory::comm);
  r.data<double>()[0] = ok ? double(g.size()) : double(g.rank());
  g.all_reduce(r, comm::ReduceOp::min);
  const int first = int(r.data<double>()[0]);
  return first < g.size() ? first : -1;
}

void throw_unless_ok_everywhere(const comm::Group& g, bool ok, const std::string& why, const std::string& what,
                                const std::string& fix) {
  const int bad = first_failing_rank(g, ok);
  LOOM_CHECK(bad < 0, "checkpoint", what,
             bad == g.rank() ? ": " + why : str_cat(" on rank ", bad, " (its reason is in its log)"), fix);
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log, const VerifyScope& scope,
                                                        const comm::Group* agree, int64_t max_step) {
  return find_latest_valid_checkpoint(
      dir, log, [&](const std::string&) { return scope; }, agree, max_step);
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log,
                                                        const std::function<VerifyScope(const std::string&)>& scope_of,
                                                        const comm::Group* agree, int64_t max_step) {
  if (!agree || agree->size() == 1) return io::find_latest_valid_checkpoint(dir, log, scope_of, max_step);
  io::CandidateAgreement a;
  a.same_candidate = [&](int64_t step) {  // every rank must be looking at the same one (or all at none)
    Tensor s = Tensor::zeros({2}, DType::f64, MemCategory::comm);
    s.data<double>()[0] = double(step);
    s.data<double>()[1] = -double(step);
    agree->all_reduce(s, comm::ReduceOp::min);
    const int64_t lo = int64_t(s.data<double>()[0]), hi = -int64_t(s.data<double>()[1]);
    LOOM_CHECK(lo == hi, "resume", "ranks see different checkpoints in ", dir, " (step ", hi, " on one, ",
               lo < 0 ? std::string("none") : std::to_string(lo),
               " on another); checkpoint.dir must be a directory every rank shares");
  };
  a.valid_everywhere = [&](bool ok, const std::string& p, std::string* why) {
    const int bad = first_failing_rank(*agree, ok);
    if (bad == agree->rank() && bad != 0)  // only rank 0 logs; only this rank knows why
      std::fprintf(stderr, "[resume] rank %d: %s failed verification: %s\n", bad, p.c_str(), why->c_str());
    if (bad > 0 && agree->rank() != bad)
      *why = str_cat("rank ", bad, "'s files failed verification (its reason is in its log)");
    return bad < 0;
  };
  return io::find_latest_valid_checkpoint(dir, log, scope_of, max_step, &a);
}

VerifyScope checkpoint_load_scope(const comm::Group& world) { return VerifyScope::rank(world.rank()); }

}  // namespace loom::train
