#include "loom/parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "loom/core/error.h"

namespace loom::parallel {

using Kind = PipeAction::Kind;

PipeSchedule pipe_schedule_from_name(const std::string& name) {
  if (name == "gpipe") return PipeSchedule::gpipe;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  fail("config", "parallel.pp_schedule: expected \"gpipe\" or \"1f1b\", got \"", name, "\"");
}

const char* pipe_schedule_name(PipeSchedule s) { return s == PipeSchedule::gpipe ? "gpipe" : "1f1b"; }

static void check_sizes(int p, int m) {
  LOOM_CHECK(p >= 1, "pipeline", "a pipeline needs at least one stage, got ", p);
  LOOM_CHECK(m >= 1, "pipeline", "a pipeline needs at least one micro-batch, got ", m);
}

std::vector<StageActions> gpipe_schedule(int p, int m) {
  check_sizes(p, m);
  std::vector<StageActions> out(static_cast<size_t>(p));
  for (auto& st : out) {
    for (int i = 0; i < m; ++i) st.push_back({Kind::forward, i});
    for (int i = 0; i < m; ++i) st.push_back({Kind::backward, i});
  }
  return out;
}

std::vector<StageActions> one_f_one_b_schedule(int p, int m) {
  check_sizes(p, m);
  std::vector<StageActions> out(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    StageActions& st = out[size_t(s)];
    const int warmup = std::min(p - s - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) st.push_back({Kind::forward, f});
    while (f < m) {  // steady state: one forward, one backward
      st.push_back({Kind::forward, f++});
      st.push_back({Kind::backward, b++});
    }
    while (b < m) st.push_back({Kind::backward, b++});
  }
  return out;
}

std::vector<StageActions> make_schedule(PipeSchedule kind, int p, int m) {
  return kind == PipeSchedule::gpipe ? gpipe_schedule(p, m) : one_f_one_b_schedule(p, m);
}

int max_in_flight(const StageActions& actions) {
  int live = 0, peak = 0;
  for (const auto& a : actions) {
    live += a.kind == Kind::forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

Timeline simulate_schedule(const std::vector<StageActions>& sched, const std::vector<double>& tf,
                           const std::vector<double>& tb) {
  const size_t p = sched.size();
  LOOM_CHECK(tf.size() == p && tb.size() == p, "pipeline", "simulate_schedule: ", p, " stages but ", tf.size(),
             " forward and ", tb.size(), " backward times");
  constexpr double kNever = std::numeric_limits<double>::infinity();
  int m = 0;
  for (const auto& st : sched)
    for (const auto& a : st) m = std::max(m, a.micro + 1);
  // done[kind][s][i]: finish time of that action (infinity until it has run).
  std::vector<std::vector<double>> fdone(p, std::vector<double>(size_t(m), kNever)), bdone = fdone;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  Timeline t;
  t.busy.assign(p, 0);
  t.start.assign(p, {});
  size_t remaining = 0;
  for (const auto& st : sched) remaining += st.size();
  while (remaining > 0) {
    bool progressed = false;
    for (size_t s = 0; s < p; ++s) {
      while (next[s] < sched[s].size()) {
        const PipeAction& a = sched[s][next[s]];
        const size_t i = size_t(a.micro);
        double ready;
        if (a.kind == Kind::forward)
          ready = s == 0 ? 0.0 : fdone[s - 1][i];
        else
          ready = s + 1 == p ? fdone[s][i] : bdone[s + 1][i];
        if (ready == kNever) break;  // waits for another stage
        const double begin = std::max(clock[s], ready);
        const double dur = a.kind == Kind::forward ? tf[s] : tb[s];
        t.start[s].push_back(begin);
        clock[s] = begin + dur;
        t.busy[s] += dur;
        (a.kind == Kind::forward ? fdone : bdone)[s][i] = clock[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    LOOM_CHECK(progressed, "pipeline", "the schedule deadlocks: every stage waits for an action ", "that cannot run");
  }
  for (double c : clock) t.makespan = std::max(t.makespan, c);
  return t;
}

std::vector<double> Timeline::idle_fraction() const {
  std::vector<double> out;
  for (double b : busy) out.push_back(makespan > 0 ? (makespan - b) / makespan : 0.0);
  return out;
}

std::string check_schedule(const std::vector<StageActions>& sched, int m) {
  for (size_t s = 0; s < sched.size(); ++s) {
    std::vector<int> fwd(size_t(m), 0), bwd(size_t(m), 0);
    for (const auto& a : sched[s]) {
      if (a.micro < 0 || a.micro >= m) return str_cat("stage ", s, " names micro-batch ", a.micro, " of ", m);
      const size_t i = size_t(a.micro);
      if (a.kind == Kind::forward) {
        if (fwd[i]++) return str_cat("stage ", s, " runs forward ", a.micro, " twice");
      } else {
        if (!fwd[i]) return str_cat("stage ", s, " runs backward ", a.micro, " before its forward");
        if (bwd[i]++) return str_cat("stage ", s, " runs backward ", a.micro, " twice");
      }
    }
    for (int i = 0; i < m; ++i)
      if (!fwd[size_t(i)] || !bwd[size_t(i)])
        return str_cat("stage ", s, " never runs the ", fwd[size_t(i)] ? "backward" : "forward", " of micro-batch ", i);
  }
  try {
    simulate_schedule(sched, std::vector<double>(sched.size(), 1.0), std::vector<double>(sched.size(), 2.0));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double bubble_fraction(int p, int m) { return double(p - 1) / double(m + p - 1); }

}  // namespace loom::parallel
