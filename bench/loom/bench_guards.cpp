// `loom bench guards RUN.jsonl...`: replays recorded loss curves (metrics JSONL written with
// log.every=1) through the loss guards' detectors (train/loss_guard.h) with the given
// thresholds, to choose and check their defaults: for each run the largest spike z-score, the
// spikes at --spike-z, the largest smoothed-to-minimum ratio, the longest stretch above
// --divergence-factor, the step a divergence would be declared at and the step the loss first
// doubled (a loss above twice the lowest before it). Spikes are judged as a run without
// checkpoint.dir judges them (counted; guard.max_spikes in a row start the window again). A
// healthy run must show no spike and no divergence; a diverging one both, early.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "bench/loom/bench.h"
#include "loom/io/file.h"
#include "loom/train/loss_guard.h"
#include "loom/train/run_metrics.h"
#include "loom/train/train_config.h"

namespace loom::cli {

int bench_guards(const std::vector<std::string>& args) {
  auto app = bench_app("guards",
                       "Replays the train losses of metrics JSONL files (loom train --set log.every=1) through the "
                       "spike and divergence detectors. One line per file, then SUMMARY {json} with a row per file.");
  std::vector<std::string> files;
  train::GuardConfig g;
  app->add_option("FILES", files, "metrics JSONL files")->required()->type_name("RUN.jsonl");
  app->add_option("--spike-z", g.spike_z, "guard.spike_z")->check(non_negative());
  app->add_option("--spike-window", g.spike_window, "guard.spike_window")
      ->check(CLI::Range(int64_t(4), int64_t(1) << 40));
  app->add_option("--divergence-factor", g.divergence_factor, "guard.divergence_factor")->check(CLI::Range(1.01, 1e6));
  app->add_option("--divergence-steps", g.divergence_steps, "guard.divergence_steps")->check(positive());
  int64_t min_history = -1;
  app->add_option("--spike-min-history", min_history,
                  "losses the spike window holds before it judges (-1: the guard's)");
  if (auto rc = parse(*app, args)) return *rc;
  std::printf("%-28s %6s %14s %7s %6s %9s %10s %9s %9s\n", "run", "steps", "max z (step)", "spikes", "first",
              "max ratio", "longest>f", "diverged", "doubled");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& file : files) {
    const train::RunMetrics m = train::parse_run_metrics(io::read_file(file));
    LOOM_CHECK(!m.loss.empty(), "bench", file, " has no step lines with a loss");
    train::SpikeDetector spikes(g.spike_z, g.spike_window, min_history);
    train::DivergenceDetector div(g.divergence_factor, g.divergence_steps);
    double max_z = 0, min_loss = INFINITY;
    int64_t max_z_step = -1, n_spikes = 0, in_row = 0, first_spike = -1, diverged = -1, doubled = -1, gaps = 0,
            prev = 0;
    for (size_t i = 0; i < m.loss.step.size(); ++i) {
      const int64_t step = int64_t(m.loss.step[i]);
      const double loss = m.loss.value[i];
      if (step != prev + 1) ++gaps;
      prev = step;
      if (!std::isfinite(loss)) continue;
      const train::SpikeVerdict v = spikes.observe(loss);
      if (v.spike && n_spikes++ == 0) first_spike = step;
      // As the trainer does with nothing to roll back to: max_spikes in a row start the window again.
      in_row = v.spike ? in_row + 1 : 0;
      if (in_row >= g.max_spikes) {
        spikes.clear();
        in_row = 0;
      }
      // The largest z, judged as the guard judges (spikes kept out of the window).
      if (v.window > 0 && v.z > max_z) {
        max_z = v.z;
        max_z_step = step;
      }
      if (div.observe(step, loss) && diverged < 0) diverged = step;
      if (doubled < 0 && loss > 2 * min_loss) doubled = step;
      min_loss = std::min(min_loss, loss);
    }
    const std::string name = std::filesystem::path(file).filename().string();
    std::printf("%-28s %6zu %8.2f (%3lld) %7lld %6lld %9.3f %10lld %9lld %9lld%s\n", name.c_str(), m.loss.step.size(),
                max_z, (long long)max_z_step, (long long)n_spikes, (long long)first_spike, div.max_ratio(),
                (long long)div.longest_above(), (long long)diverged, (long long)doubled,
                gaps ? "  (not every step logged: log.every=1)" : "");
    rows.push_back({{"run", name},
                    {"steps", m.loss.step.size()},
                    {"max_z", max_z},
                    {"max_z_step", max_z_step},
                    {"spikes", n_spikes},
                    {"first_spike_at", first_spike},
                    {"max_ratio", div.max_ratio()},
                    {"longest_above", div.longest_above()},
                    {"diverged_at", diverged},
                    {"first_doubled_at", doubled}});
  }
  const nlohmann::json s = {{"spike_z", g.spike_z},
                            {"spike_window", g.spike_window},
                            {"divergence_factor", g.divergence_factor},
                            {"divergence_steps", g.divergence_steps},
                            {"runs", rows}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
