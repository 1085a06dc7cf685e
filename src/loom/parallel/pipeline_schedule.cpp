#include "loom/parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "loom/core/error.h"

namespace loom::parallel {

using Kind = PipeAction::Kind;

PipeSchedule pipe_schedule_from_name(const std::string& name) {
  if (name == "gpipe") return PipeSchedule::gpipe;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  if (name == "zb1p") return PipeSchedule::zero_bubble_h1;
  fail("config", "parallel.pp_schedule: expected \"gpipe\", \"1f1b\" or \"zb1p\", got \"", name, "\"");
}

const char* pipe_schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe: return "gpipe";
    case PipeSchedule::one_f_one_b: return "1f1b";
    case PipeSchedule::zero_bubble_h1: return "zb1p";
  }
  return "?";
}

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

std::vector<StageActions> interleaved_schedule(int p, int m, int v) {
  check_sizes(p, m);
  LOOM_CHECK(v >= 1, "pipeline", "virtual stages must be at least 1, got ", v);
  if (v == 1) return one_f_one_b_schedule(p, m);
  LOOM_CHECK(m % p == 0, "pipeline", "interleaved 1F1B runs micro-batches in groups of the stage count: m=", m,
             " is not a multiple of p=", p);
  const int total = m * v;  // actions of each kind per stage
  auto nth = [&](int k, Kind kind) {
    const int group = k / (p * v), in = k % (p * v);
    const int chunk = kind == Kind::forward ? in / p : v - 1 - in / p;
    return PipeAction{kind, group * p + in % p, chunk};
  };
  std::vector<StageActions> out(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    StageActions& st = out[size_t(s)];
    const int warmup = std::min(2 * (p - s - 1) + (v - 1) * p, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) st.push_back(nth(f, Kind::forward));
    while (f < total) {
      st.push_back(nth(f++, Kind::forward));
      st.push_back(nth(b++, Kind::backward));
    }
    while (b < total) st.push_back(nth(b++, Kind::backward));
  }
  return out;
}

std::vector<StageActions> zero_bubble_h1_schedule(int p, int m) {
  std::vector<StageActions> out = one_f_one_b_schedule(p, m);
  for (int s = 0; s < p; ++s) {
    StageActions split;
    int next_weight = 0, backwards = 0;
    for (const PipeAction& a : out[size_t(s)]) {
      split.push_back(a);
      if (a.kind == Kind::backward && ++backwards > s) split.push_back({Kind::weight, next_weight++});
    }
    while (next_weight < m) split.push_back({Kind::weight, next_weight++});
    out[size_t(s)] = std::move(split);
  }
  return out;
}

std::vector<StageActions> make_schedule(PipeSchedule kind, int p, int m, int v) {
  LOOM_CHECK(v == 1 || kind == PipeSchedule::one_f_one_b, "pipeline", "virtual stages (v=", v,
             ") interleave the 1F1B schedule, not ", pipe_schedule_name(kind));
  switch (kind) {
    case PipeSchedule::gpipe: return gpipe_schedule(p, m);
    case PipeSchedule::one_f_one_b: return interleaved_schedule(p, m, v);
    case PipeSchedule::zero_bubble_h1: return zero_bubble_h1_schedule(p, m);
  }
  return {};
}

void check_virtual_stages(PipeSchedule kind, int p, int m, int v, int n_layer) {
  LOOM_CHECK(v >= 1, "config", "parallel.virtual_stages=", v, " must be at least 1");
  if (v == 1) return;
  LOOM_CHECK(p >= 2, "config", "parallel.virtual_stages=", v, " needs a pipeline (parallel.pp >= 2, got ", p,
             "); set parallel.virtual_stages=1");
  LOOM_CHECK(kind == PipeSchedule::one_f_one_b, "config", "parallel.virtual_stages=", v,
             " interleaves the 1F1B schedule; set parallel.pp_schedule=1f1b or parallel.virtual_stages=1");
  LOOM_CHECK(n_layer % (p * v) == 0, "config", "parallel.virtual_stages=", v,
             " needs model.n_layer divisible by parallel.pp x parallel.virtual_stages = ", p * v,
             " (equal chunks of blocks), got n_layer=", n_layer, "; choose virtual_stages so that pp x virtual_stages ",
             "divides n_layer");
  LOOM_CHECK(m % p == 0, "config", "parallel.virtual_stages=", v, " runs micro-batches in groups of parallel.pp=", p,
             ": parallel.micro_batches=", m, " is not a multiple of ", p,
             "; use parallel.micro_batches=", (m / p + 1) * p);
}

int max_in_flight(const StageActions& actions) {
  const bool split =
      std::any_of(actions.begin(), actions.end(), [](const PipeAction& a) { return a.kind == Kind::weight; });
  const Kind ends = split ? Kind::weight : Kind::backward;  // what frees a micro-batch's activations
  int live = 0, peak = 0;
  for (const auto& a : actions) {
    live += a.kind == Kind::forward ? 1 : a.kind == ends ? -1 : 0;
    peak = std::max(peak, live);
  }
  return peak;
}

bool splits_backward(const std::vector<StageActions>& sched) {
  for (const auto& st : sched)
    for (const auto& a : st)
      if (a.kind == Kind::weight) return true;
  return false;
}

int schedule_chunks(const std::vector<StageActions>& sched) {
  int v = 1;
  for (const auto& st : sched)
    for (const auto& a : st) v = std::max(v, a.chunk + 1);
  return v;
}

Timeline simulate_schedule(const std::vector<StageActions>& sched, const std::vector<double>& tf,
                           const std::vector<double>& tb, const std::vector<double>& tw) {
  const size_t p = sched.size();
  LOOM_CHECK(tf.size() == p && tb.size() == p, "pipeline", "simulate_schedule: ", p, " stages but ", tf.size(),
             " forward and ", tb.size(), " backward times");
  LOOM_CHECK(tw.size() == p || !splits_backward(sched), "pipeline", "simulate_schedule: a split schedule of ", p,
             " stages needs as many weight-pass times, got ", tw.size());
  constexpr double kNever = std::numeric_limits<double>::infinity();
  int m = 0;
  for (const auto& st : sched)
    for (const auto& a : st) m = std::max(m, a.micro + 1);
  const size_t v = size_t(schedule_chunks(sched));
  // fdone / bdone[(s * v + c) * m + i]: finish time of that action (infinity until it has run).
  std::vector<double> fdone(p * v * size_t(m), kNever), bdone = fdone;
  auto at = [&](size_t s, size_t c, size_t i) { return (s * v + c) * size_t(m) + i; };
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
        const size_t i = size_t(a.micro), c = size_t(a.chunk);
        double ready;
        if (a.kind == Kind::forward)
          ready = s > 0 ? fdone[at(s - 1, c, i)] : c > 0 ? fdone[at(p - 1, c - 1, i)] : 0.0;
        else if (a.kind == Kind::weight)
          ready = bdone[at(s, c, i)];
        else if (s + 1 < p)
          ready = bdone[at(s + 1, c, i)];
        else
          ready = c + 1 < v ? bdone[at(0, c + 1, i)] : fdone[at(s, c, i)];
        if (ready == kNever) break;  // waits for another stage
        const double begin = std::max(clock[s], ready);
        const double dur = a.kind == Kind::forward ? tf[s] : a.kind == Kind::backward ? tb[s] : tw[s];
        t.start[s].push_back(begin);
        clock[s] = begin + dur;
        t.busy[s] += dur;
        if (a.kind != Kind::weight) (a.kind == Kind::forward ? fdone : bdone)[at(s, c, i)] = clock[s];
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
  const int v = schedule_chunks(sched);
  const bool split = splits_backward(sched);
  for (size_t s = 0; s < sched.size(); ++s) {
    std::vector<int> fwd(size_t(m * v), 0), bwd(size_t(m * v), 0), wgt(size_t(m * v), 0);
    for (const auto& a : sched[s]) {
      if (a.micro < 0 || a.micro >= m) return str_cat("stage ", s, " names micro-batch ", a.micro, " of ", m);
      if (a.chunk < 0) return str_cat("stage ", s, " names chunk ", a.chunk);
      const size_t i = size_t(a.chunk * m + a.micro);
      const std::string what = v > 1 ? str_cat(a.micro, " of chunk ", a.chunk) : str_cat(a.micro);
      if (a.kind == Kind::forward) {
        if (fwd[i]++) return str_cat("stage ", s, " runs forward ", what, " twice");
      } else if (a.kind == Kind::weight) {
        if (!bwd[i]) return str_cat("stage ", s, " runs the weight pass of ", what, " before its backward");
        if (wgt[i]++) return str_cat("stage ", s, " runs the weight pass of ", what, " twice");
      } else {
        if (!fwd[i]) return str_cat("stage ", s, " runs backward ", what, " before its forward");
        if (bwd[i]++) return str_cat("stage ", s, " runs backward ", what, " twice");
      }
    }
    for (int i = 0; i < m * v; ++i) {
      const std::string where = str_cat(" of micro-batch ", i % m, v > 1 ? str_cat(" in chunk ", i / m) : "");
      if (!fwd[size_t(i)] || !bwd[size_t(i)])
        return str_cat("stage ", s, " never runs the ", fwd[size_t(i)] ? "backward" : "forward", where);
      if (split && !wgt[size_t(i)]) return str_cat("stage ", s, " never runs the weight pass", where);
    }
  }
  try {
    simulate_schedule(sched, std::vector<double>(sched.size(), 1.0), std::vector<double>(sched.size(), 2.0),
                      std::vector<double>(sched.size(), 1.0));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double bubble_fraction(int p, int m, int v) { return double(p - 1) / double(v * m + p - 1); }

double zero_bubble_h1_fraction(int p, int m) { return double(p - 1) / double(3 * m + p - 1); }

double predicted_bubble(PipeSchedule kind, int p, int m, int v) {
  return kind == PipeSchedule::zero_bubble_h1 ? zero_bubble_h1_fraction(p, m) : bubble_fraction(p, m, v);
}

}  // namespace loom::parallel
