#include "loom/train/loss_guard.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"

namespace loom::train {

namespace {

double median_of(std::vector<double>& v) {  // reorders v
  const size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  if (n % 2) return v[mid];
  return 0.5 * (v[mid] + *std::max_element(v.begin(), v.begin() + long(mid)));
}

}  // namespace

SpikeDetector::SpikeDetector(double z, int64_t window, int64_t min_history)
    : z_(z),
      window_(size_t(std::max<int64_t>(window, 4))),
      min_history_(size_t(std::clamp<int64_t>(min_history < 0 ? kMinHistory : min_history, 3, int64_t(window_)))) {}

SpikeVerdict SpikeDetector::observe(double loss) {
  SpikeVerdict v;
  v.window = losses_.size();
  if (z_ > 0 && losses_.size() >= min_history_) {  // enough history to judge
    // The median and the median absolute deviation: a few wild losses that joined the window
    // (a blow-up's first steps) move neither, where they would inflate a mean and a deviation.
    std::vector<double> sorted = losses_;
    const double median = median_of(sorted);
    for (double& l : sorted) l = std::abs(l - median);
    // 1.4826 x MAD estimates the standard deviation of normally distributed losses.
    const double spread = std::max(1.4826 * median_of(sorted), kSpreadFloor * std::abs(median));
    v.median = median;
    v.z = (loss - median) / spread;
    v.spike = v.z > z_;
  }
  if (!v.spike) {
    if (losses_.size() < window_) {
      losses_.push_back(loss);
    } else {
      losses_[next_] = loss;
      next_ = (next_ + 1) % window_;
    }
  }
  return v;
}

void SpikeDetector::clear() {
  losses_.clear();
  next_ = 0;
}

DivergenceDetector::DivergenceDetector(double factor, int64_t steps) : factor_(factor), steps_(steps) {}

bool DivergenceDetector::observe(int64_t step, double loss) {
  // The smoothing starts at the first loss (and again after restart()).
  ema_ = started_ ? ema_ + kSmoothing * (loss - ema_) : loss;
  started_ = true;
  if (min_step_ == 0 || ema_ < min_) {  // min_step_ 0: no loss seen yet
    min_ = ema_;
    min_step_ = step;
  }
  // Against at least kMinimumFloor: a memorising fine-tune whose loss wanders between 0.01 and
  // 0.05 nats is not diverging (and a minimum at or below zero cannot be multiplied).
  const double ratio = ema_ / std::max(min_, kMinimumFloor);
  max_ratio_ = std::max(max_ratio_, ratio);
  last_step_ = step;
  if (ratio <= kHealthyBand && loss <= factor_ * lowest_) healthy_step_ = step;
  lowest_ = std::min(lowest_, loss);
  if (ratio > factor_) {
    if (above_since_ < 0) above_since_ = step;
    ++above_;
  } else {
    above_since_ = -1;
    above_ = 0;
  }
  longest_above_ = std::max(longest_above_, above_);
  return factor_ > 1 && above_ >= steps_;
}

void DivergenceDetector::restart(int64_t step) {
  started_ = false;
  healthy_step_ = std::min(healthy_step_, step);
  last_step_ = std::min(last_step_, step);
  above_since_ = -1;
  above_ = 0;
}

std::vector<std::string> likely_divergence_causes(const DivergenceSuspects& s) {
  std::vector<std::string> out;
  // Adam's step is about lr per weight whatever the gradient: above ~1e-2 few models train.
  if (s.lr > 1e-2) out.push_back(str_cat("optim.lr=", s.lr, " is high for Adam (models train at 1e-4 to 3e-3)"));
  if (s.warmup_steps == 0) out.push_back("schedule.warmup_steps=0 (no warmup: the first steps use the full rate)");
  if (s.clip_max_norm <= 0 && !s.clip_dynamic) out.push_back("gradient clipping is off (schedule.clip.max_norm: 1.0)");
  if (s.beta2 < 0.9)
    out.push_back(str_cat("optim.beta2=", s.beta2, " is low (0.95-0.999 keep the second moment steady)"));
  if (s.eps < 1e-12) out.push_back(str_cat("optim.eps=", s.eps, " is tiny (1e-8 bounds each weight's step)"));
  return out;
}

}  // namespace loom::train
