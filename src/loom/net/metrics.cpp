// Prometheus text exposition (https://prometheus.io/docs/instrumenting/exposition_formats/).
#include "loom/net/metrics.h"

#include <cmath>
#include <cstdio>

#include "loom/core/error.h"

namespace loom::net {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i + 1 < bounds_.size(); ++i)
    LOOM_CHECK(bounds_[i] < bounds_[i + 1], "metrics", "histogram bounds must ascend");
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;  // Prometheus buckets are le (<=)
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) out[i] = acc += buckets_[i].load(std::memory_order_relaxed);
  return out;
}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, Type type, const std::string& help) {
  auto [it, fresh] = families_.try_emplace(name);
  if (fresh) {
    it->second.type = type;
    it->second.help = help;
  }
  LOOM_CHECK(it->second.type == type, "metrics", "metric ", name, " was registered with another type");
  return it->second;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = family(name, Type::counter, help).counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = family(name, Type::gauge, help).gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = family(name, Type::histogram, help).histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string render_labels(const Labels& labels, const std::string& extra_key = "",
                          const std::string& extra_value = "") {
  if (labels.empty() && extra_key.empty()) return "";
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    s += str_cat(first ? "" : ",", k, "=\"", escape_label(v), "\"");
    first = false;
  }
  if (!extra_key.empty()) s += str_cat(first ? "" : ",", extra_key, "=\"", extra_value, "\"");
  return s + "}";
}

}  // namespace

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::counter ? "counter" : f.type == Type::gauge ? "gauge" : "histogram";
    out += str_cat("# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, c] : f.counters)
      out += str_cat(name, render_labels(labels), " ", format_metric_value(c->value()), "\n");
    for (const auto& [labels, g] : f.gauges)
      out += str_cat(name, render_labels(labels), " ", format_metric_value(g->value()), "\n");
    for (const auto& [labels, h] : f.histograms) {
      std::vector<uint64_t> cum = h->cumulative();
      for (size_t i = 0; i < cum.size(); ++i) {
        std::string le = i < h->bounds().size() ? format_metric_value(h->bounds()[i]) : "+Inf";
        out += str_cat(name, "_bucket", render_labels(labels, "le", le), " ", cum[i], "\n");
      }
      // Bucket counts and count are read separately; report count from the +Inf bucket so
      // a scrape is always self-consistent.
      out += str_cat(name, "_sum", render_labels(labels), " ", format_metric_value(h->sum()), "\n");
      out += str_cat(name, "_count", render_labels(labels), " ", cum.back(), "\n");
    }
  }
  return out;
}

}  // namespace loom::net
