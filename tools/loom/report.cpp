// `loom report RUN_DIR [--out FILE] [--metrics FILE]`: one self-contained HTML page of a
// training run from its metrics JSONL (charts, restarts and guards, environment, config).
// The reading and the rendering live in loom/train/run_metrics.h and run_report.h.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/train/run_metrics.h"
#include "loom/train/run_report.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

namespace fs = std::filesystem;

std::string find_metrics(const std::string& run_dir) {
  LOOM_CHECK(fs::is_directory(run_dir), "report", run_dir,
             " is not a directory; give the run's directory (where its metrics JSONL is) or --metrics FILE");
  if (fs::is_regular_file(fs::path(run_dir) / "metrics.jsonl")) return (fs::path(run_dir) / "metrics.jsonl").string();
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(run_dir))
    if (e.is_regular_file() && e.path().extension() == ".jsonl") found.push_back(e.path().string());
  std::sort(found.begin(), found.end());
  LOOM_CHECK(!found.empty(), "report", run_dir,
             ": no metrics JSONL (looked for metrics.jsonl, *.jsonl); pass --metrics FILE");
  LOOM_CHECK(found.size() == 1, "report", run_dir, ": ", found.size(), " *.jsonl files and no metrics.jsonl (",
             found[0], ", ", found[1], (found.size() > 2 ? ", ..." : ""), "); pass --metrics FILE");
  return found[0];
}

}  // namespace

int cmd_report(const std::vector<std::string>& argv) {
  auto app = new_app("report",
                     "Writes one self-contained HTML page (inline SVG, no scripts, nothing fetched) of a training "
                     "run: train and validation loss, learning rate, gradient norm, tokens/s, MFU, memory by "
                     "category, exposed communication, resumes, rollbacks and skipped steps, the environment and "
                     "the config. The run's metrics are the JSONL of log.metrics_path (loom train --metrics).");
  std::string run_dir, metrics, out;
  app->add_option("RUN_DIR", run_dir, "the training run's directory")->type_name("DIR")->required();
  app->add_option("--metrics", metrics,
                  "the metrics JSONL (default: RUN_DIR/metrics.jsonl, or the only *.jsonl in RUN_DIR)")
      ->type_name("FILE");
  app->add_option("--out", out, "where to write the page (default: RUN_DIR/report.html)")->type_name("FILE");
  double moe_after = -1;
  app->add_option("--moe-after", moe_after,
                  "MoE runs: the expert-load table covers the logged steps after STEP (default: half the run)")
      ->type_name("STEP")
      ->check(non_negative())
      ->default_str("");
  if (auto rc = parse(*app, argv)) return *rc;
  if (metrics.empty()) metrics = find_metrics(run_dir);
  LOOM_CHECK(fs::is_regular_file(metrics), "report", "--metrics ", metrics, ": no such file");
  const train::RunMetrics m = train::parse_run_metrics(io::read_file(metrics));
  for (const std::string& w : m.warnings)
    std::fprintf(stderr, "[report] warning: %s:%s\n", metrics.c_str(), w.substr(5).c_str());
  LOOM_CHECK(m.step_lines > 0, "report", metrics,
             ": no step lines (objects with \"step\" and \"loss\"); is it "
             "the JSONL of log.metrics_path (loom train --metrics FILE)?");
  if (out.empty()) out = (fs::path(run_dir) / "report.html").string();
  io::write_file_atomic(out, train::render_run_report(m, metrics, moe_after));
  std::printf("[report] wrote %s: %s\n", out.c_str(), train::run_report_summary(m).c_str());
  return 0;
}

}  // namespace loom::cli
