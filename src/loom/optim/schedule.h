// Learning-rate schedule (linear warmup, then cosine decay to min_lr) and the gradient-norm
// clipping helpers. Pure functions of the step; no state.
#pragma once
#include <cstdint>

namespace loom::optim {

struct LrSchedule {
  double peak_lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = -1;  // -1: the default min(10000, 10% of total_steps)
  int64_t total_steps = 1;

  int64_t resolved_warmup() const;
  // Learning rate for 0-based step s: (s+1)/warmup * peak during warmup, then cosine.
  double lr_at(int64_t s) const;
};

// Dynamic clipping threshold max(1, 10 * (1 - step/total)): loose early, tightening later.
double dynamic_clip_threshold(int64_t step, int64_t total_steps);

// Sum of squares of g[0..n), accumulated in f64 in a fixed order (deterministic).
double sum_squares(const float* g, int64_t n);

}  // namespace loom::optim
