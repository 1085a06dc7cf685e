#include "loom/train/run_metrics.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/model/moe.h"

namespace loom::train {

namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The series' points after `step`, removed; returns how many.
size_t drop_after(MetricSeries& s, double step, MetricSeries* keep = nullptr) {
  size_t n = 0;
  for (size_t i = 0; i < s.step.size(); ++i) {
    if (s.step[i] > step) {
      if (keep) {
        keep->step.push_back(s.step[i]);
        keep->value.push_back(s.value[i]);
      }
      ++n;
      continue;
    }
    s.step[i - n] = s.step[i];
    s.value[i - n] = s.value[i];
  }
  s.step.resize(s.step.size() - n);
  s.value.resize(s.value.size() - n);
  return n;
}

MetricSeries& series_named(std::vector<MetricSeries>& v, const std::string& name) {
  for (auto& s : v)
    if (s.name == name) return s;
  v.push_back(MetricSeries(name));
  return v.back();
}

// Memory series in the allocator's category order (MemCategory); names it does not know last.
void sort_categories(std::vector<MetricSeries>& v) {
  static const std::vector<std::string> kOrder = {"params",    "grads",    "optimizer", "activations",
                                                  "workspace", "kv_cache", "comm",      "other"};
  const auto rank = [](const MetricSeries& s) {
    return size_t(std::find(kOrder.begin(), kOrder.end(), s.name) - kOrder.begin());
  };
  std::stable_sort(v.begin(), v.end(), [&](const MetricSeries& a, const MetricSeries& b) { return rank(a) < rank(b); });
}

std::string string_or(const json& j, const char* key, const std::string& def = "") {
  const auto it = j.find(key);
  if (it == j.end()) return def;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// A line's number under `key` into out (null, a non-finite value, reads as NaN): false when
// the key is absent; throws the reason when it holds something else.
bool number_at(const json& j, const char* key, double& out) {
  const auto it = j.find(key);
  if (it == j.end()) return false;
  if (it->is_null()) {
    out = kNaN;
    return true;
  }
  if (!it->is_number()) throw std::runtime_error(std::string("\"") + key + "\" is not a number");
  out = it->get<double>();
  return true;
}

void add(MetricSeries& s, double step, double v) {
  s.step.push_back(step);
  s.value.push_back(v);
}

struct MoePoint {
  int64_t layer;
  double load, dropped, window_dropped;
  std::vector<int64_t> tokens, window_tokens;
};

// b[key] as token counts (empty when absent).
std::vector<int64_t> counts_at(const json& b, const char* key) {
  std::vector<int64_t> out;
  const auto t = b.find(key);
  if (t == b.end()) return out;
  if (!t->is_array()) throw std::runtime_error(std::string("\"moe\".") + key + " is not an array");
  for (const json& v : *t) {
    if (!v.is_number_integer()) throw std::runtime_error(std::string("\"moe\".") + key + " holds a non-integer");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// The line's "moe" array, checked whole before anything is added.
std::vector<MoePoint> read_moe(const json& j) {
  std::vector<MoePoint> pts;
  const auto it = j.find("moe");
  if (it == j.end()) return pts;
  if (!it->is_array()) throw std::runtime_error("\"moe\" is not an array");
  for (const json& b : *it) {
    MoePoint p{};
    if (!b.is_object() || !b.value("layer", json()).is_number_integer() || !number_at(b, "load_max_over_mean", p.load))
      throw std::runtime_error("\"moe\" entries need an integer \"layer\" and \"load_max_over_mean\"");
    p.layer = b["layer"].get<int64_t>();
    if (!number_at(b, "dropped_fraction", p.dropped)) p.dropped = kNaN;
    if (!number_at(b, "window_dropped_fraction", p.window_dropped)) p.window_dropped = kNaN;
    p.tokens = counts_at(b, "tokens_per_expert");
    p.window_tokens = counts_at(b, "tokens_per_expert_window");
    pts.push_back(std::move(p));
  }
  return pts;
}

void add_moe(const std::vector<MoePoint>& pts, double step, RunMetrics& m) {
  if (pts.empty()) return;
  double worst = 0, sum = 0;
  for (const MoePoint& p : pts) {
    auto b = std::find_if(m.moe.begin(), m.moe.end(), [&](const MoeBlockSeries& s) { return s.layer == p.layer; });
    if (b == m.moe.end()) {
      MoeBlockSeries s;
      s.layer = p.layer;
      b = m.moe.insert(
          std::upper_bound(m.moe.begin(), m.moe.end(), s,
                           [](const MoeBlockSeries& x, const MoeBlockSeries& y) { return x.layer < y.layer; }),
          std::move(s));
    }
    add(b->load, step, p.load);
    add(b->dropped, step, p.dropped);
    if (!p.tokens.empty()) b->tokens.emplace_back(step, p.tokens);
    if (!p.window_tokens.empty()) {
      b->window_tokens.emplace_back(step, p.window_tokens);
      add(b->window_dropped, step, p.window_dropped);
    }
    worst = std::max(worst, p.load);
    sum += p.load;
  }
  add(m.moe_worst_load, step, worst);
  add(m.moe_mean_load, step, sum / double(pts.size()));
}

void read_step_line(const json& j, double step, RunMetrics& m) {
  static constexpr std::pair<const char*, MetricSeries RunMetrics::*> kFields[] = {
      {"loss", &RunMetrics::loss},
      {"lr", &RunMetrics::lr},
      {"grad_norm", &RunMetrics::grad_norm},
      {"tokens_per_s", &RunMetrics::tokens_per_s},
      {"mfu", &RunMetrics::mfu},
      {"exposed_comm_ms", &RunMetrics::exposed_comm_ms}};
  // Checked before anything is added, so a bad line adds nothing.
  double values[std::size(kFields)];
  bool present[std::size(kFields)];
  for (size_t k = 0; k < std::size(kFields); ++k) present[k] = number_at(j, kFields[k].first, values[k]);
  const auto mem = j.find("memory");
  if (mem != j.end() && !mem->is_object()) throw std::runtime_error("\"memory\" is not an object");
  if (mem != j.end())
    for (const auto& [cat, v] : mem->items())
      if (!v.is_object() || !v.value("current", json()).is_number() || !v.value("peak", json()).is_number())
        throw std::runtime_error("\"memory\"." + cat + " is not {\"current\": bytes, \"peak\": bytes}");
  const std::vector<MoePoint> moe = read_moe(j);
  for (size_t k = 0; k < std::size(kFields); ++k)
    if (present[k]) add(m.*kFields[k].second, step, values[k]);
  if (mem != j.end())
    for (const auto& [cat, v] : mem->items()) {
      add(series_named(m.memory_current, cat), step, v["current"].get<double>());
      add(series_named(m.memory_peak, cat), step, v["peak"].get<double>());
    }
  add_moe(moe, step, m);
  m.skipped_steps = j.value("skipped_steps", int64_t(0));
  m.nonfinite_steps = j.value("nonfinite_steps", int64_t(0));
  m.rollbacks = j.value("rollbacks", int64_t(0));
  ++m.step_lines;
}

RunStart read_run_start(const json& j, int64_t step) {
  RunStart s;
  s.step = step;
  s.resumed = j.value("resumed", false);
  s.run_id = string_or(j, "run_id");
  s.layout = string_or(j, "layout");
  s.config = string_or(j, "config");
  s.world_size = j.value("world_size", int64_t(1));
  if (const auto env = j.find("environment"); env != j.end() && env->is_object())
    for (const auto& [k, v] : env->items())
      s.environment.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
  return s;
}

// Every series drops what was logged after `step`; returns the number of step lines dropped.
size_t rewind_to(RunMetrics& m, double step, bool keep_losses) {
  const size_t n = drop_after(m.loss, step, keep_losses ? &m.rolled_back_loss : nullptr);
  for (MetricSeries* s : {&m.val_loss, &m.lr, &m.grad_norm, &m.tokens_per_s, &m.mfu, &m.exposed_comm_ms})
    drop_after(*s, step);
  for (auto* v : {&m.memory_current, &m.memory_peak})
    for (auto& s : *v) drop_after(s, step);
  drop_after(m.moe_worst_load, step);
  drop_after(m.moe_mean_load, step);
  for (MoeBlockSeries& b : m.moe) {
    drop_after(b.load, step);
    drop_after(b.dropped, step);
    drop_after(b.window_dropped, step);
    std::erase_if(b.tokens, [&](const auto& t) { return t.first > step; });
    std::erase_if(b.window_tokens, [&](const auto& t) { return t.first > step; });
  }
  return n;
}

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

std::vector<MoeWindowLoad> moe_window_loads(const RunMetrics& m, double after_step) {
  std::vector<MoeWindowLoad> out;
  for (const MoeBlockSeries& b : m.moe) {
    MoeWindowLoad w;
    w.layer = b.layer;
    std::vector<double> loads;
    double dropped = 0;
    for (size_t i = 0; i < b.load.step.size(); ++i) {
      if (b.load.step[i] <= after_step) continue;
      loads.push_back(b.load.value[i]);
      w.worst_step_load = std::max(w.worst_step_load, b.load.value[i]);
      dropped += std::isfinite(b.dropped.value[i]) ? b.dropped.value[i] : 0.0;
    }
    w.steps = int64_t(loads.size());
    w.median_step_load = median(loads);
    w.dropped = loads.empty() ? kNaN : dropped / double(loads.size());
    // Whole windows when the file has them: every step's tokens, not every log.every-th.
    const bool windows = !b.window_tokens.empty();
    if (windows) {
      double sum = 0;
      int64_t n = 0;
      for (size_t i = 0; i < b.window_dropped.step.size(); ++i)
        if (b.window_dropped.step[i] > after_step && std::isfinite(b.window_dropped.value[i])) {
          sum += b.window_dropped.value[i];
          ++n;
        }
      if (n) w.dropped = sum / double(n);
    }
    std::vector<int64_t> pooled;
    for (const auto& [step, tokens] : windows ? b.window_tokens : b.tokens) {
      if (step <= after_step) continue;
      if (pooled.size() < tokens.size()) pooled.resize(tokens.size(), 0);
      for (size_t e = 0; e < tokens.size(); ++e) pooled[e] += tokens[e];
    }
    const double pooled_load = model::load_max_over_mean(pooled);
    w.pooled_load = pooled_load > 0 ? pooled_load : kNaN;
    out.push_back(w);
  }
  return out;
}

RunMetrics parse_run_metrics(const std::string& jsonl) {
  RunMetrics m;
  std::istringstream in(jsonl);
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto warn = [&](const std::string& why) {
      m.warnings.push_back("line " + std::to_string(line_no) + ": " + why);
    };
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      warn("not a JSON object (" + line.substr(0, 60) + (line.size() > 60 ? "...)" : ")"));
      continue;
    }
    const auto st = j.find("step");
    if (st == j.end() || !st->is_number_integer()) {
      warn("no integer \"step\"");
      continue;
    }
    const int64_t step = st->get<int64_t>();
    const std::string event = string_or(j, "event");
    try {
      if (event == "run_start") {
        m.starts.push_back(read_run_start(j, step));
      } else if (event == "resume") {
        rewind_to(m, double(step), false);
        m.events.push_back({"resume", step,
                            "run " + string_or(j, "run_id", "?") + " resumed from " + string_or(j, "checkpoint", "?")});
      } else if (event == "rollback") {
        const size_t n = rewind_to(m, double(step), true);
        m.events.push_back({"rollback", step,
                            "loss spike from step " + string_or(j, "skipped_from_step", "?") + ": rolled back to " +
                                string_or(j, "checkpoint", "?") + ", " + string_or(j, "skipped_steps", "?") +
                                " batches skipped, " + std::to_string(n) + " logged steps discarded"});
      } else if (event == "spike") {
        double v = NAN;
        number_at(j, "loss", v);
        add(m.spikes, double(step), v);
      } else if (event == "divergence") {
        m.events.push_back(
            {"divergence", step,
             "the loss is diverging (guard.divergence=warn); it began after step " + string_or(j, "began_after", "?")});
      } else if (event == "end") {
        m.ended = string_or(j, "ended", "?");
        m.end_step = step;
        m.end_reason = string_or(j, "reason", "");
        if (const auto h = j.find("last_healthy_step"); h != j.end() && h->is_number_integer())
          m.last_healthy_step = h->get<int64_t>();
        if (m.ended != "finished") m.events.push_back({m.ended, step, m.end_reason});
      } else if (!event.empty()) {
        continue;  // an event this reader does not know
      } else if (j.contains("val_loss")) {
        double v = 0;
        number_at(j, "val_loss", v);
        add(m.val_loss, double(step), v);
      } else if (j.contains("loss")) {
        read_step_line(j, double(step), m);
      } else {
        warn("neither a step (\"loss\") nor a validation (\"val_loss\") line nor an event");
      }
    } catch (const std::exception& e) {
      warn(e.what());
    }
  }
  sort_categories(m.memory_current);
  sort_categories(m.memory_peak);
  return m;
}

}  // namespace loom::train
