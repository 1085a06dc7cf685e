// The loss guards' detectors, pure (losses in, verdicts out) so that the trainer, the tests and
// `loom bench guards` (which replays recorded runs to measure the defaults) judge a loss curve
// the same way:
// - SpikeDetector: a loss far above the recent ones (a z-score over a window of accepted
//   losses): one bad batch, or the first step of a blow-up.
// - DivergenceDetector: the smoothed loss staying far above its running minimum for many steps:
//   a run that is no longer learning and will not come back by itself.
// The trainer (trainer_guards.cpp) decides what a verdict does: roll back, count, warn or stop.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

struct SpikeVerdict {
  bool spike = false;
  double z = 0;       // robust standard deviations above the window's median (0 while it fills)
  double median = 0;  // the window's median loss
  size_t window = 0;  // accepted losses the verdict was taken over
};

// A loss more than `z` standard deviations above the median of the last `window` accepted losses
// is a spike, the deviation estimated robustly (1.4826 x the median absolute deviation). Spikes do not join the window;
// nothing is judged before it holds `min_history` losses (-1: kMinHistory, or the whole window when smaller).
class SpikeDetector {
 public:
  // Three losses suffice (with kSpreadFloor): a run that blows up in its first steps is caught.
  static constexpr int64_t kMinHistory = 3;
  // A floor on the spread, as a fraction of the mean: a flat stretch of the curve (or the first
  // few steps' chance agreement) must not turn noise into spikes.
  static constexpr double kSpreadFloor = 0.01;
  SpikeDetector(double z, int64_t window, int64_t min_history = -1);
  SpikeVerdict observe(double loss);
  // Forgets the window (after a rollback, or to accept a new level of the loss).
  void clear();

 private:
  double z_;
  size_t window_, min_history_;
  std::vector<double> losses_;  // a ring of the last accepted losses
  size_t next_ = 0;
};

// The smoothed loss (an exponential moving average, weight kSmoothing on each new loss) is compared
// with its own running minimum: above `factor` times it for `steps` steps in a row is a divergence.
class DivergenceDetector {
 public:
  static constexpr double kSmoothing = 0.1;
  // A step is healthy while its smoothed loss is within this factor of the minimum and its own
  // loss at most `factor` times the lowest loss before it: where a divergence is said to begin.
  static constexpr double kHealthyBand = 1.1;
  // The minimum the factor multiplies is at least this many nats.
  static constexpr double kMinimumFloor = 0.1;

  DivergenceDetector(double factor, int64_t steps);
  // Step `step`'s loss (1-based; non-finite losses are not passed). True on the step that makes
  // it a divergence, and on every later step while it lasts.
  bool observe(int64_t step, double loss);
  // After a rollback to step `step`: the smoothing restarts from the next loss, the minimum stays,
  // and steps after `step` (of the abandoned trajectory) are no longer the last healthy one.
  void restart(int64_t step);

  double smoothed() const { return ema_; }
  double minimum() const { return min_; }
  int64_t minimum_step() const { return min_step_; }
  // The last healthy step (0 before the first): the divergence began after it.
  int64_t last_healthy_step() const { return healthy_step_; }
  // The last step observed was healthy (true before the first).
  bool healthy() const { return healthy_step_ == last_step_; }
  // The smoothed loss has been above factor x minimum since this step (-1: it is not).
  int64_t above_since() const { return above_since_; }
  int64_t steps_above() const { return above_; }
  // The largest smoothed-to-minimum ratio and longest run of steps above factor seen so far
  // (what `loom bench guards` reports of a healthy run).
  double max_ratio() const { return max_ratio_; }
  int64_t longest_above() const { return longest_above_; }

 private:
  double factor_;
  int64_t steps_;
  bool started_ = false;
  double ema_ = 0, min_ = 0, max_ratio_ = 0, lowest_ = INFINITY;
  int64_t min_step_ = 0, healthy_step_ = 0, last_step_ = 0, above_since_ = -1, above_ = 0, longest_above_ = 0;
};

// What a diverged run's log says might have caused it, from the settings that usually do:
// a high learning rate, no warmup, clipping off, a tiny beta2 or epsilon. Empty when none looks
// suspicious (the data, the initialisation or the model are then the next places to look).
struct DivergenceSuspects {
  double lr = 0, beta2 = 0.999, eps = 1e-8, clip_max_norm = 0;
  bool clip_dynamic = false;
  int64_t warmup_steps = 0;
};
std::vector<std::string> likely_divergence_causes(const DivergenceSuspects& s);

}  // namespace loom::train
