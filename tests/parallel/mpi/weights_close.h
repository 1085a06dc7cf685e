// The weight-comparison policy shared by the parallel equivalence tests (see the tolerance
// note in dp_equivalence_test.cpp): |a - b| <= 1e-5 |b| + step_fraction lr for all but a share
// `outliers` of the elements, none beyond worst_fraction of lr * steps, GPT-2's gradient-free
// key bias skipped. f32 runs use the defaults; bf16 runs bf16_weight_tolerance().
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "loom/model/param_layout.h"

namespace loom::testing {

struct WeightTolerance {
  double step_fraction = 1e-3;
  double outliers = 1.0 / 2000;
  double worst_fraction = 1e-2;
};

// bf16 products round operands to 8 significant bits, so a reduction order's f32 noise flips
// some roundings, and the flips spread through later products: two layouts' bf16 runs drift
// apart by bf16 noise, far more than f32 runs do. Measured on gpt2-tiny and llama-tiny, 20
// AdamW steps, dp/tp/pp on 2-8 ranks: the bf16 note in dp_equivalence_test.cpp.
inline WeightTolerance bf16_weight_tolerance() { return {0.2, 0.03, 0.15}; }
// Per-step losses of two bf16 runs: relative difference at most this.
inline constexpr double kBf16LossTolerance = 5e-4;

inline void expect_weights_close(const std::vector<float>& a, const model::ParamLayout& a_layout,
                                 const std::vector<float>& ref, const model::ParamLayout& ref_layout, double lr,
                                 double steps, const std::string& what, const WeightTolerance& tol = {}) {
  int64_t over = 0, total = 0;
  double worst = 0;
  for (const auto& p : ref_layout.params()) {
    const bool key_bias = p.name.find("attn.c_attn.bias") != std::string::npos;
    const int64_t C = key_bias ? p.numel() / 3 : 0;
    const int64_t oa = a_layout.get(p.name).offset;
    for (int64_t i = 0; i < p.numel(); ++i) {
      if (key_bias && i >= C && i < 2 * C) continue;
      ++total;
      const double x = a[size_t(oa + i)], y = ref[size_t(p.offset + i)];
      const double d = std::abs(x - y);
      worst = std::max(worst, d / (lr * steps));
      if (d > 1e-5 * std::abs(y) + tol.step_fraction * lr) ++over;
      if (d > tol.worst_fraction * lr * steps)
        ADD_FAILURE() << what << ": " << p.name << "[" << i << "] = " << x << ", single process " << y;
    }
  }
  EXPECT_LE(over, int64_t(double(total) * tol.outliers))
      << what << ": " << over << " of " << total << " weights outside 1e-5 relative + " << tol.step_fraction
      << " lr (largest difference " << worst << " of lr * steps)";
}

}  // namespace loom::testing
