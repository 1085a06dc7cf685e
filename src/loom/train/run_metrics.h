// A training run's metrics JSONL (what Trainer writes to log.metrics_path) read back as plot
// series, run starts and events, for `loom report`. Pure: text in, values out; it neither
// opens files nor renders anything (train/run_report.h does).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

// One quantity against the step; a value may be NaN (a non-finite loss is logged as null).
struct MetricSeries {
  explicit MetricSeries(std::string series_name = "") : name(std::move(series_name)) {}
  std::string name;
  std::vector<double> step, value;
  bool empty() const { return step.empty(); }
};

// A {"event":"run_start"} line: one per process that opened the file (a resume adds one).
struct RunStart {
  int64_t step = 0;
  bool resumed = false;
  std::string run_id, layout, config;  // config: the resolved YAML
  int64_t world_size = 1;
  std::vector<std::pair<std::string, std::string>> environment;  // in the file's order
};

// A resume, a rollback or a guard's verdict, for the report's table.
struct RunEvent {
  std::string kind;  // "resume" | "rollback" | "divergence" (a warning) | "diverged" | "nonfinite" (the end)
  int64_t step = 0;  // the step training continued from (a verdict: the step it was taken at)
  std::string detail;
};

// One Mixture-of-Experts block's router statistics at the logged steps (the step lines' "moe").
struct MoeBlockSeries {
  int64_t layer = -1;
  MetricSeries load{"load max/mean"}, dropped{"dropped fraction"};
  // Tokens routed to each expert at a logged step (tokens_per_expert), and over all the steps
  // since the previous logged one (tokens_per_expert_window), with their dropped fraction
  // (window_dropped_fraction); absent in older files.
  std::vector<std::pair<double, std::vector<int64_t>>> tokens, window_tokens;
  MetricSeries window_dropped{"dropped fraction since the last log"};
};

struct RunMetrics {
  MetricSeries loss{"train loss"}, val_loss{"val loss"}, lr{"learning rate"}, grad_norm{"grad norm"},
      tokens_per_s{"tokens/s"}, mfu{"MFU"}, exposed_comm_ms{"exposed comm"};
  // Losses of steps a rollback discarded (the spike and what followed it), kept to be seen.
  MetricSeries rolled_back_loss{"rolled back"};
  // Loss spikes the guard saw (rolled back or only counted): points on the loss chart.
  MetricSeries spikes{"spikes"};
  // The {"event":"end"} line: "finished", "diverged" or "nonfinite"; "" when the file has none
  // (the run is still going, or it crashed). A stopped run's reason and last healthy step.
  std::string ended, end_reason;
  int64_t end_step = -1, last_healthy_step = -1;
  // Per allocation category in the allocator's order (params, grads, optimizer, activations,
  // workspace, kv_cache, comm, other; unknown names after): bytes at the logged step, peak.
  std::vector<MetricSeries> memory_current, memory_peak;
  // MoE runs: per block in layer order, and per step the worst block's and the mean load.
  std::vector<MoeBlockSeries> moe;
  MetricSeries moe_worst_load{"worst block"}, moe_mean_load{"mean over blocks"};
  std::vector<RunStart> starts;
  std::vector<RunEvent> events;
  // The last step line's guard counters (0 when it has none).
  int64_t skipped_steps = 0, nonfinite_steps = 0, rollbacks = 0;
  int64_t step_lines = 0;
  // Lines that could not be used, each "line N: why"; they are skipped.
  std::vector<std::string> warnings;
};

// Step lines become points; {"step","val_loss"} lines validation points; "run_start",
// "resume", "rollback" and "divergence" lines starts and events; "spike" lines spike points; the
// "end" line how the run ended (and an event when a guard stopped it). A resume or rollback at step S drops the
// points after S logged before it (the steps are trained again), so every series runs forward
// in steps; a rollback keeps the dropped losses in rolled_back_loss. Unknown events and keys
// are ignored; malformed lines are skipped and named in warnings.
RunMetrics parse_run_metrics(const std::string& jsonl);

// A MoE block's load over the logged steps after `after_step`: the median and the largest of
// those steps' max/mean, the max/mean of the tokens pooled per expert over the logging windows
// that end after it (every step when the file has tokens_per_expert_window, else the logged
// steps' tokens_per_expert; NaN with neither), and the mean dropped fraction (of the windows,
// else of the logged steps). One entry per block in m.moe.
struct MoeWindowLoad {
  int64_t layer = -1, steps = 0;
  double median_step_load = 0, worst_step_load = 0, pooled_load = 0, dropped = 0;
};
std::vector<MoeWindowLoad> moe_window_loads(const RunMetrics& m, double after_step);

}  // namespace loom::train
