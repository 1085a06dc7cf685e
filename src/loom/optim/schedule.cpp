#include "loom/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/core/isa_target.h"

namespace loom::optim {

int64_t LrSchedule::resolved_warmup() const {
  if (warmup_steps >= 0) return warmup_steps;
  return std::min<int64_t>(10000, total_steps / 10);
}

double LrSchedule::lr_at(int64_t s) const {
  const int64_t w = resolved_warmup();
  if (s < w) return peak_lr * double(s + 1) / double(w);
  if (total_steps <= w) return peak_lr;
  const double progress = std::min(1.0, double(s - w) / double(std::max<int64_t>(1, total_steps - w)));
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double dynamic_clip_threshold(int64_t step, int64_t total_steps) {
  const double frac = total_steps > 0 ? double(step) / double(total_steps) : 1.0;
  return std::max(1.0, 10.0 * (1.0 - frac));
}

namespace {
// One block's sum of squares in f64 over eight interleaved partial sums; compiled for AVX-512,
// AVX2 and the baseline, picked at load time (the parallel loop stays outside: GCC outlines an
// OpenMP region into a function that would not inherit the target). Same result on each.
LOOM_TARGET_CLONES_X86 double block_sum_squares(const float* g, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += double(g[i + k]) * double(g[i + k]);
  for (; i < n; ++i) acc[0] += double(g[i]) * double(g[i]);
  double s = 0;
  for (double a : acc) s += a;
  return s;
}
}  // namespace

double sum_squares(const float* g, int64_t n) {
  // Fixed blocks reduced in block order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 1 << 16;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b)
    part[size_t(b)] = block_sum_squares(g + b * kBlock, std::min(n, (b + 1) * kBlock) - b * kBlock);
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace loom::optim
