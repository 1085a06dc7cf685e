#include "loom/parallel/pipeline_schedule.h"

#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <span>

#include "loom/core/error.h"

namespace loom::parallel {

using Kind = PipeAction::Kind;

PipeSchedule pipe_schedule_from_name(const std::string& name) {
  if (name == "gpipe") return PipeSchedule::gpipe;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  if (name == "zb1p") return PipeSchedule::zero_bubble_h1;
  if (name == "zbv") return PipeSchedule::zero_bubble_v;
  fail("config", "parallel.pp_schedule: expected \"gpipe\", \"1f1b\", \"zb1p\" or \"zbv\", got \"", name, "\"");
}

const char* pipe_schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe: return "gpipe";
    case PipeSchedule::one_f_one_b: return "1f1b";
    case PipeSchedule::zero_bubble_h1: return "zb1p";
    case PipeSchedule::zero_bubble_v: return "zbv";
  }
  return "?";
}

ChunkPlacement chunk_placement(PipeSchedule s) {
  return s == PipeSchedule::zero_bubble_v ? ChunkPlacement::vee : ChunkPlacement::loop;
}

int schedule_chunk_count(PipeSchedule s, int virtual_stages) {
  return s == PipeSchedule::zero_bubble_v ? 2 : virtual_stages;
}

int model_chunk(int s, int c, int p, int /*chunks*/, ChunkPlacement placement) {
  if (placement == ChunkPlacement::vee) return c == 0 ? s : 2 * p - 1 - s;
  return c * p + s;
}

namespace {
// The stage and chunk holding the model's chunk k.
ChunkAt locate_chunk(int k, int p, int v, ChunkPlacement placement) {
  if (k < 0 || k >= p * v) return {};
  if (placement == ChunkPlacement::vee) return k < p ? ChunkAt{k, 0} : ChunkAt{2 * p - 1 - k, 1};
  return {k % p, k / p};
}
}  // namespace

ChunkAt chunk_input_from(int s, int c, int p, int v, ChunkPlacement placement) {
  return locate_chunk(model_chunk(s, c, p, v, placement) - 1, p, v, placement);
}

ChunkAt chunk_output_to(int s, int c, int p, int v, ChunkPlacement placement) {
  return locate_chunk(model_chunk(s, c, p, v, placement) + 1, p, v, placement);
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

namespace {

// One ZB-V order from the list scheduler (zero_bubble_v_schedule): pass times tf, tb, tw; among
// the passes a free stage can start first, `order` ranks the kinds (then chunk 1 before chunk 0);
// a forward of chunk 0 waits while `reserve` more sets would reach the stage's limit (room kept
// for chunk 1's forwards); with `weights_in_gaps` a weight pass also runs whenever it ends before any
// other pass could start. Empty when the replay stalls.
std::vector<StageActions> list_schedule_v(int p, int m, int first_limit, double tf, double tb, double tw,
                                          const std::array<Kind, 3>& order, int reserve, bool weights_in_gaps) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  // Activation sets (each of one chunk) a stage may keep: 1F1B's peak, 2p (stage 0: first_limit).
  auto limit_of = [&](int s) { return s == 0 ? first_limit : 2 * p; };
  auto at = [&](int s, int c, int i) { return (size_t(s) * 2 + size_t(c)) * size_t(m) + size_t(i); };
  std::vector<double> fdone(size_t(p) * 2 * size_t(m), kNever), bdone = fdone;
  std::vector<std::array<int, 2>> fnext(size_t(p), {0, 0}), bnext = fnext;
  std::vector<std::deque<PipeAction>> weights(static_cast<size_t>(p));
  std::vector<int> live(size_t(p), 0);
  std::vector<double> clock(size_t(p), 0.0);
  std::vector<StageActions> out(static_cast<size_t>(p));
  const size_t total = size_t(6 * m);
  auto rank_of = [&](Kind k) { return int(std::find(order.begin(), order.end(), k) - order.begin()); };
  struct Pick {
    double start;
    PipeAction a;
  };
  for (;;) {
    int who = -1;
    Pick best{kNever, {Kind::forward, 0, 0}};
    for (int s = 0; s < p; ++s) {
      const size_t su = size_t(s);
      if (out[su].size() == total) continue;
      std::array<Pick, 5> cands;  // the next B and F of each chunk, the oldest W
      size_t n = 0;
      for (int c = 1; c >= 0; --c) {
        if (const int i = bnext[su][size_t(c)]; i < m) {
          const ChunkAt to = chunk_output_to(s, c, p, 2, ChunkPlacement::vee);
          const double ready = to.valid() ? bdone[at(to.stage, to.chunk, i)] : fdone[at(s, c, i)];
          if (ready != kNever) cands[n++] = {std::max(clock[su], ready), {Kind::backward, i, c}};
        }
        if (const int i = fnext[su][size_t(c)]; i < m && live[su] < limit_of(s) - (c == 1 ? 0 : reserve)) {
          const ChunkAt from = chunk_input_from(s, c, p, 2, ChunkPlacement::vee);
          const double ready = from.valid() ? fdone[at(from.stage, from.chunk, i)] : 0.0;
          if (ready != kNever) cands[n++] = {std::max(clock[su], ready), {Kind::forward, i, c}};
        }
      }
      if (!weights[su].empty()) cands[n++] = {clock[su], weights[su].front()};
      if (n == 0) continue;
      double first = kNever, first_other = kNever;
      for (const Pick& x : std::span(cands.data(), n)) {
        first = std::min(first, x.start);
        if (x.a.kind != Kind::weight) first_other = std::min(first_other, x.start);
      }
      if (weights_in_gaps && !weights[su].empty() && first_other >= clock[su] + tw) first = clock[su];
      const Pick* pick = nullptr;
      for (const Pick& x : std::span(cands.data(), n))  // chunk 1 before chunk 0 by the candidates' order
        if (x.start <= first && (!pick || rank_of(x.a.kind) < rank_of(pick->a.kind))) pick = &x;
      if (pick->start < best.start) {
        best = *pick;
        who = s;
      }
    }
    if (who < 0) break;
    const size_t su = size_t(who);
    const PipeAction& a = best.a;
    double dur = tw;
    if (a.kind == Kind::forward) {
      ++fnext[su][size_t(a.chunk)];
      ++live[su];
      dur = tf;
    } else if (a.kind == Kind::backward) {
      ++bnext[su][size_t(a.chunk)];
      weights[su].push_back({Kind::weight, a.micro, a.chunk});
      dur = tb;
    } else {
      weights[su].pop_front();
      --live[su];
    }
    clock[su] = best.start + dur;
    if (a.kind == Kind::forward) fdone[at(who, a.chunk, a.micro)] = clock[su];
    if (a.kind == Kind::backward) bdone[at(who, a.chunk, a.micro)] = clock[su];
    out[su].push_back(a);
  }
  for (const auto& st : out)
    if (st.size() != total) return {};
  return out;
}

struct SearchedOrder {
  std::vector<StageActions> schedule;
  double worst = std::numeric_limits<double>::infinity();  // idle over 1F1B's, at the worst ratio
};

SearchedOrder search_schedule_v(int p, int m, int first_limit) {
  // Nominal pass times the scheduler plans with, and the ratios each candidate is judged on: the
  // worst idle (relative to 1F1B's at those times) over all of them decides.
  const std::array<std::array<double, 3>, 4> nominal{{{1, 1, 1}, {8, 9, 7}, {7, 9, 8}, {9, 9, 7}}};
  const std::array<std::array<double, 3>, 5> judged{
      {{1, 1, 1}, {32, 36, 28}, {32, 40, 24}, {28, 36, 32}, {40, 36, 28}}};
  std::array<Kind, 3> order{Kind::forward, Kind::backward, Kind::weight};
  std::sort(order.begin(), order.end());
  SearchedOrder best;
  for (const auto& nom : nominal) {
    do {
      for (int reserve = 0; reserve <= p; ++reserve)
        for (bool gaps : {false, true}) {
          std::vector<StageActions> sched =
              list_schedule_v(p, m, first_limit, nom[0], nom[1], nom[2], order, reserve, gaps);
          if (sched.empty()) continue;
          double worst = 0;
          for (const auto& t : judged) {
            const Timeline tl =
                simulate_schedule(sched, std::vector<double>(size_t(p), t[0]), std::vector<double>(size_t(p), t[1]),
                                  std::vector<double>(size_t(p), t[2]), ChunkPlacement::vee);
            double idle = 0;
            for (size_t s = 0; s < size_t(p); ++s) idle = std::max(idle, tl.makespan - tl.busy[s]);
            worst = std::max(worst, idle / (2 * (p - 1) * (t[0] + t[1] + t[2])));
          }
          if (worst < best.worst) best = {std::move(sched), worst};
        }
    } while (std::next_permutation(order.begin(), order.end()));
  }
  return best;
}

}  // namespace

std::vector<StageActions> zero_bubble_v_schedule(int p, int m) {
  check_sizes(p, m);
  LOOM_CHECK(p >= 2, "pipeline", "the ZB-V schedule needs at least two stages, got ", p);
  // The search takes milliseconds to a second; the trainer asks again for each micro-batch count.
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::vector<StageActions>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({p, m});
  if (it == cache.end()) {
    // Stage 0 also keeps the head's buffers: one activation set fewer there, unless that costs
    // idle time (it can with an odd m).
    SearchedOrder s = search_schedule_v(p, m, 2 * p - 1);
    if (s.worst > 0.3)
      if (SearchedOrder t = search_schedule_v(p, m, 2 * p); t.worst < s.worst) s = std::move(t);
    LOOM_CHECK(!s.schedule.empty(), "pipeline", "no ZB-V order found for p=", p, " m=", m);
    it = cache.emplace(std::make_pair(p, m), std::move(s.schedule)).first;
  }
  return it->second;
}

std::vector<StageActions> make_schedule(PipeSchedule kind, int p, int m, int v) {
  LOOM_CHECK(v == 1 || kind == PipeSchedule::one_f_one_b || (kind == PipeSchedule::zero_bubble_v && v == 2), "pipeline",
             "virtual stages (v=", v, ") interleave the 1F1B schedule, not ", pipe_schedule_name(kind));
  switch (kind) {
    case PipeSchedule::gpipe: return gpipe_schedule(p, m);
    case PipeSchedule::one_f_one_b: return interleaved_schedule(p, m, v);
    case PipeSchedule::zero_bubble_h1: return zero_bubble_h1_schedule(p, m);
    case PipeSchedule::zero_bubble_v: return zero_bubble_v_schedule(p, m);
  }
  return {};
}

void check_virtual_stages(PipeSchedule kind, int p, int m, int v, int n_layer) {
  LOOM_CHECK(v >= 1, "config", "parallel.virtual_stages=", v, " must be at least 1");
  if (kind == PipeSchedule::zero_bubble_v && (p > 1 || v > 1)) {  // one stage: no pipeline, nothing placed
    LOOM_CHECK(v == 2, "config", "parallel.pp_schedule=zbv places 2 chunks of blocks on each stage; ",
               "parallel.virtual_stages=", v, " asks for ", v, "; leave it unset");
    LOOM_CHECK(p >= 2, "config", "parallel.pp_schedule=zbv needs a pipeline (parallel.pp >= 2, got ", p, ")");
    LOOM_CHECK(n_layer % (2 * p) == 0, "config", "parallel.pp_schedule=zbv needs model.n_layer divisible by 2 x ",
               "parallel.pp = ", 2 * p, " (two equal chunks of blocks per stage), got n_layer=", n_layer);
    return;
  }
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
                           const std::vector<double>& tb, const std::vector<double>& tw, ChunkPlacement placement,
                           double transfer) {
  const size_t p = sched.size();
  LOOM_CHECK(tf.size() == p && tb.size() == p, "pipeline", "simulate_schedule: ", p, " stages but ", tf.size(),
             " forward and ", tb.size(), " backward times");
  LOOM_CHECK(tw.size() == p || !splits_backward(sched), "pipeline", "simulate_schedule: a split schedule of ", p,
             " stages needs as many weight-pass times, got ", tw.size());
  std::vector<std::vector<double>> times(p);
  for (size_t s = 0; s < p; ++s)
    for (const PipeAction& a : sched[s])
      times[s].push_back(a.kind == Kind::forward ? tf[s] : a.kind == Kind::backward ? tb[s] : tw[s]);
  return replay_schedule(sched, times, placement, transfer);
}

Timeline replay_schedule(const std::vector<StageActions>& sched, const std::vector<std::vector<double>>& times,
                         ChunkPlacement placement, double transfer) {
  const size_t p = sched.size();
  LOOM_CHECK(times.size() == p, "pipeline", "replay_schedule: ", p, " stages but times for ", times.size());
  for (size_t s = 0; s < p; ++s)
    LOOM_CHECK(times[s].size() == sched[s].size(), "pipeline", "replay_schedule: stage ", s, " runs ", sched[s].size(),
               " actions but has ", times[s].size(), " times");
  LOOM_CHECK(transfer >= 0, "pipeline", "replay_schedule: transfer time ", transfer, " s is negative");
  constexpr double kNever = std::numeric_limits<double>::infinity();
  int m = 0;
  for (const auto& st : sched)
    for (const auto& a : st) m = std::max(m, a.micro + 1);
  const size_t v = size_t(schedule_chunks(sched));
  // fdone / bdone[(s * v + c) * m + i]: finish time of that action (infinity until it has run).
  std::vector<double> fdone(p * v * size_t(m), kNever), bdone = fdone;
  auto at = [&](size_t s, size_t c, size_t i) { return (s * v + c) * size_t(m) + i; };
  // When what `from` made for stage s is there (infinity until it has run).
  auto arrival = [&](const std::vector<double>& done, const ChunkAt& from, size_t s, size_t i) {
    const double t = done[at(size_t(from.stage), size_t(from.chunk), i)];
    return size_t(from.stage) == s ? t : t + transfer;
  };
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
        if (a.kind == Kind::forward) {
          const ChunkAt from = chunk_input_from(int(s), int(c), int(p), int(v), placement);
          ready = from.valid() ? arrival(fdone, from, s, i) : 0.0;
        } else if (a.kind == Kind::weight) {
          ready = bdone[at(s, c, i)];
        } else {
          const ChunkAt to = chunk_output_to(int(s), int(c), int(p), int(v), placement);
          ready = to.valid() ? arrival(bdone, to, s, i) : fdone[at(s, c, i)];
        }
        if (ready == kNever) break;  // waits for another stage
        const double begin = std::max(clock[s], ready);
        const double dur = times[s][next[s]];
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

std::string check_schedule(const std::vector<StageActions>& sched, int m, ChunkPlacement placement) {
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
                      std::vector<double>(sched.size(), 1.0), placement);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double bubble_fraction(int p, int m, int v) { return double(p - 1) / double(v * m + p - 1); }

double zero_bubble_h1_fraction(int p, int m) { return double(p - 1) / double(3 * m + p - 1); }

double zero_bubble_v_fraction(int p, int m) {
  const std::vector<double> one(size_t(p), 1.0);
  const Timeline t = simulate_schedule(zero_bubble_v_schedule(p, m), one, one, one, ChunkPlacement::vee);
  double idle = 0;
  for (double x : t.idle_fraction()) idle += x / p;
  return idle;
}

const char* bubble_formula(PipeSchedule kind, int v) {
  if (kind == PipeSchedule::zero_bubble_v) return "its schedule replayed with equal F, B and W passes";
  if (kind == PipeSchedule::zero_bubble_h1) return "(p-1)/(3m+p-1)";
  return v > 1 ? "(p-1)/(vm+p-1)" : "(p-1)/(m+p-1)";
}

double predicted_bubble(PipeSchedule kind, int p, int m, int v) {
  if (kind == PipeSchedule::zero_bubble_v) return zero_bubble_v_fraction(p, m);
  return kind == PipeSchedule::zero_bubble_h1 ? zero_bubble_h1_fraction(p, m) : bubble_fraction(p, m, v);
}

}  // namespace loom::parallel
