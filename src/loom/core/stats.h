// Order statistics for the figures benchmarks and profilers report, one definition everywhere:
// linear interpolation between the closest ranks (NumPy's default, and what vLLM's serving
// benchmark reports), so a median of an even count is the mean of the middle two and a P99 of
// 100 samples lies between the 99th and 100th smallest.
#pragma once
#include <algorithm>
#include <vector>

#include "loom/core/error.h"

namespace loom {

// p in [0, 100]; 0 for an empty sample.
inline double percentile(std::vector<double> v, double p) {
  LOOM_CHECK(p >= 0 && p <= 100, "stats", "percentile must lie in [0, 100], got ", p);
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

inline double median(std::vector<double> v) { return percentile(std::move(v), 50); }

}  // namespace loom
