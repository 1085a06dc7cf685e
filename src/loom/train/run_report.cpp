#include "loom/train/run_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "loom/io/svg_plot.h"

namespace loom::train {

namespace {

std::string num(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1 << 20));
  return buf;
}

io::PlotSeries plot_series(const MetricSeries& s, double scale = 1) {
  io::PlotSeries p;
  p.name = s.name;
  p.x = s.step;
  for (double v : s.value) p.y.push_back(v * scale);
  return p;
}

// Marks without a line joining them (events such as spikes).
io::PlotSeries point_series(const MetricSeries& s) {
  io::PlotSeries p = plot_series(s);
  p.line = false;
  return p;
}

ReportChart chart(std::string id, std::string title, std::string y_label, std::vector<io::PlotSeries> series) {
  ReportChart c{std::move(id), {std::move(title), "step", std::move(y_label), {}, {}}};
  for (auto& s : series)
    if (!s.x.empty()) c.panel.series.push_back(std::move(s));
  return c;
}

double last_finite(const MetricSeries& s) {
  for (size_t i = s.value.size(); i-- > 0;)
    if (std::isfinite(s.value[i])) return s.value[i];
  return NAN;
}

double first_finite(const MetricSeries& s) {
  for (double v : s.value)
    if (std::isfinite(v)) return v;
  return NAN;
}

int64_t last_step(const RunMetrics& m) { return m.loss.empty() ? 0 : int64_t(m.loss.step.back()); }

// The root <svg> of one chart, tagged for tests; the namespace is implied inside HTML.
std::string chart_svg(const ReportChart& c) {
  std::string svg = io::svg_plot("", {c.panel});
  const std::string xmlns = " xmlns=\"http://www.w3.org/2000/svg\"";
  if (const size_t at = svg.find(xmlns); at != std::string::npos) svg.erase(at, xmlns.size());
  const std::string tag =
      "<svg class=\"chart\" data-chart=\"" + c.id + "\" data-series=\"" + std::to_string(c.panel.series.size()) + "\"";
  return tag + svg.substr(4);  // after "<svg"
}

void table_row(std::ostringstream& os, const std::string& name, const std::string& value) {
  os << "<tr><th>" << io::xml_escape(name) << "</th><td>" << io::xml_escape(value) << "</td></tr>\n";
}

constexpr const char* kStyle = R"(body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 4px; margin-top: 32px; }
.summary { color: #444; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.charts svg { border: 1px solid #ddd; }
pre { background: #f7f7f7; border: 1px solid #ddd; padding: 10px; overflow-x: auto; font-size: 12px; }
.warn { color: #a33; }
)";

}  // namespace

std::vector<ReportChart> report_charts(const RunMetrics& m) {
  std::vector<io::PlotSeries> memory;
  for (const MetricSeries& s : m.memory_peak) memory.push_back(plot_series(s, 1.0 / (1 << 20)));
  std::vector<ReportChart> charts;
  charts.push_back(
      chart("loss", "loss", "loss (nats)",
            {plot_series(m.loss), plot_series(m.val_loss), plot_series(m.rolled_back_loss), point_series(m.spikes)}));
  charts.push_back(chart("lr", "learning rate", "lr", {plot_series(m.lr)}));
  charts.push_back(chart("grad_norm", "gradient norm", "global norm", {plot_series(m.grad_norm)}));
  charts.push_back(chart("tokens_per_s", "throughput", "tokens/s", {plot_series(m.tokens_per_s)}));
  charts.push_back(chart("mfu", "model FLOPs utilisation", "MFU (%)", {plot_series(m.mfu, 100)}));
  charts.push_back(chart("memory", "peak memory by category (rank 0)", "MiB", std::move(memory)));
  charts.push_back(chart("exposed_comm", "exposed communication", "ms per step", {plot_series(m.exposed_comm_ms)}));
  if (!m.moe.empty()) {
    charts.push_back(chart("moe_load", "expert load (max/mean of a step's tokens)", "max/mean",
                           {plot_series(m.moe_worst_load), plot_series(m.moe_mean_load)}));
    std::vector<io::PlotSeries> dropped;
    for (const MoeBlockSeries& b : m.moe) {
      io::PlotSeries p = plot_series(b.dropped, 100);
      p.name = "block " + std::to_string(b.layer);
      dropped.push_back(std::move(p));
    }
    charts.push_back(chart("moe_dropped", "dropped choices per MoE block", "% of choices", std::move(dropped)));
  }
  return charts;
}

// How the run ended, in words.
std::string run_ending(const RunMetrics& m) {
  if (m.ended.empty()) return "no end recorded (still running, or it crashed)";
  if (m.ended == "finished") return "finished";
  std::string s = (m.ended == "diverged" ? "DIVERGED at step " : "STOPPED on non-finite values at step ") +
                  std::to_string(m.end_step);
  if (m.last_healthy_step >= 0) s += " (began after step " + std::to_string(m.last_healthy_step) + ")";
  return s;
}

std::string run_report_summary(const RunMetrics& m) {
  std::ostringstream os;
  os << last_step(m) << " steps, loss " << num(first_finite(m.loss)) << " -> " << num(last_finite(m.loss));
  if (!m.val_loss.empty()) os << ", val loss " << num(last_finite(m.val_loss));
  int64_t resumes = 0, rollbacks = 0;
  for (const RunEvent& e : m.events) {
    resumes += e.kind == "resume";
    rollbacks += e.kind == "rollback";
  }
  os << ", " << resumes << (resumes == 1 ? " resume, " : " resumes, ") << rollbacks
     << (rollbacks == 1 ? " rollback" : " rollbacks");
  if (!m.spikes.empty()) os << ", " << m.spikes.step.size() << (m.spikes.step.size() == 1 ? " spike" : " spikes");
  os << ", " << run_ending(m);
  return os.str();
}

std::string render_run_report(const RunMetrics& m, const std::string& source, double moe_after) {
  const RunStart* first = m.starts.empty() ? nullptr : &m.starts.front();
  const std::string run_id = first ? first->run_id : "";
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>loom run report";
  if (!run_id.empty()) os << ' ' << io::xml_escape(run_id);
  os << "</title>\n<style>\n" << kStyle << "</style>\n</head>\n<body>\n";
  os << "<h1>loom run report</h1>\n<p class=\"summary\">" << io::xml_escape(run_report_summary(m)) << "<br>from "
     << io::xml_escape(source) << "</p>\n";

  os << "<table class=\"facts\">\n";
  if (first) {
    table_row(os, "run id", first->run_id);
    table_row(os, "world size", std::to_string(first->world_size));
    table_row(os, "layout", first->layout);
  }
  table_row(os, "steps logged", std::to_string(m.step_lines));
  table_row(os, "last step", std::to_string(last_step(m)));
  table_row(os, "ended", run_ending(m));
  table_row(os, "final train loss", num(last_finite(m.loss)));
  table_row(os, "final val loss", m.val_loss.empty() ? "none" : num(last_finite(m.val_loss)));
  os << "</table>\n";

  os << "<h2>Charts</h2>\n<div class=\"charts\">\n";
  for (const ReportChart& c : report_charts(m)) os << chart_svg(c);
  os << "</div>\n";

  os << "<h2>Restarts and guards</h2>\n";
  const int64_t skipped = std::max(m.skipped_steps, m.nonfinite_steps);
  os << "<p>" << m.events.size() << " events; " << m.spikes.step.size() << " loss spikes; " << skipped
     << " skipped steps (" << m.nonfinite_steps << " non-finite)</p>\n";
  if (!m.events.empty()) {
    os << "<table class=\"events\">\n<tr><th>event</th><th>step</th><th>detail</th></tr>\n";
    for (const RunEvent& e : m.events)
      os << "<tr><td>" << io::xml_escape(e.kind) << "</td><td>" << e.step << "</td><td>" << io::xml_escape(e.detail)
         << "</td></tr>\n";
    os << "</table>\n";
  }

  os << "<h2>Memory by category (rank 0, last logged step)</h2>\n";
  if (m.memory_peak.empty()) {
    os << "<p>not logged</p>\n";
  } else {
    os << "<table class=\"memory\">\n<tr><th>category</th><th>current</th><th>peak</th></tr>\n";
    for (size_t k = 0; k < m.memory_peak.size(); ++k)
      os << "<tr><td>" << io::xml_escape(m.memory_peak[k].name) << "</td><td>"
         << mib(k < m.memory_current.size() ? last_finite(m.memory_current[k]) : NAN) << "</td><td>"
         << mib(last_finite(m.memory_peak[k])) << "</td></tr>\n";
    os << "</table>\n";
  }

  if (!m.moe.empty()) {
    // By default the second half of the logged steps: past the routers' early imbalance.
    const double after = moe_after >= 0 ? moe_after : double(last_step(m)) / 2;
    os << "<h2>Expert load after step " << num(after) << "</h2>\n"
       << "<p>Per MoE block over the logged steps after that one: the median and the worst step's load "
          "max/mean (one step's tokens), the load of all their tokens pooled per expert (every step's where the "
          "metrics have tokens_per_expert_window), and the mean dropped share of "
          "choices.</p>\n<table class=\"moe\">\n<tr><th>block</th><th>steps</th><th>median step</th>"
          "<th>worst step</th><th>pooled</th><th>dropped</th></tr>\n";
    for (const MoeWindowLoad& w : moe_window_loads(m, after))
      os << "<tr><td>" << w.layer << "</td><td>" << w.steps << "</td><td>" << num(w.median_step_load) << "</td><td>"
         << num(w.worst_step_load) << "</td><td>" << num(w.pooled_load) << "</td><td>" << num(100 * w.dropped)
         << "%</td></tr>\n";
    os << "</table>\n";
  }

  os << "<h2>Environment</h2>\n";
  if (m.starts.empty()) os << "<p>not recorded (no run_start line)</p>\n";
  for (const RunStart& s : m.starts) {
    os << "<h3>" << (s.resumed ? "resumed" : "started") << " at step " << s.step << "</h3>\n<table class=\"env\">\n";
    for (const auto& [k, v] : s.environment) table_row(os, k, v);
    os << "</table>\n";
  }

  os << "<h2>Config</h2>\n<pre>" << io::xml_escape(first ? first->config : "not recorded") << "</pre>\n";
  if (!m.warnings.empty()) {
    os << "<h2>Lines skipped</h2>\n<ul class=\"warn\">\n";
    for (const std::string& w : m.warnings) os << "<li>" << io::xml_escape(w) << "</li>\n";
    os << "</ul>\n";
  }
  os << "</body>\n</html>\n";
  return os.str();
}

}  // namespace loom::train
