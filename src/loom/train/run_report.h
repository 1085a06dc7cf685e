// The HTML page of `loom report`: a training run's metrics (train/run_metrics.h) as inline
// SVG charts, tables of resumes, rollbacks and skipped steps, MoE runs' expert load, the
// environment and the config.
// One self-contained document: inline CSS, no scripts, nothing fetched.
#pragma once
#include <string>
#include <vector>

#include "loom/io/svg_plot.h"
#include "loom/train/run_metrics.h"

namespace loom::train {

// One chart of the report; series holds only those with at least one point.
struct ReportChart {
  // Stable, for tests and anchors: loss, lr, grad_norm, tokens_per_s, mfu, memory, exposed_comm,
  // and for MoE runs moe_load, moe_dropped.
  std::string id;
  io::PlotPanel panel;
};

// The charts in page order: loss (train, val, rolled back), learning rate, gradient norm,
// tokens/s, MFU (%), peak memory by category (MiB), exposed communication (ms per step); for
// MoE runs the expert load (worst block, mean over blocks) and each block's dropped choices (%).
std::vector<ReportChart> report_charts(const RunMetrics& m);

// The whole page. Each chart is an <svg class="chart" data-chart="ID" data-series="N">. The
// expert-load table of a MoE run covers the logged steps after `moe_after` (negative: half the
// last step).
std::string render_run_report(const RunMetrics& m, const std::string& source, double moe_after = -1);

// "40 steps, loss 5.54 -> 2.31, val loss 2.40, 1 resume, 0 rollbacks" for the command's output.
std::string run_report_summary(const RunMetrics& m);
// How the run ended: "finished", "DIVERGED at step S (began after step B)", "STOPPED on
// non-finite values at step S (...)", or that the file records no end.
std::string run_ending(const RunMetrics& m);

}  // namespace loom::train
