// The weight-comparison policy shared by the parallel equivalence tests (see the tolerance
// note in dp_equivalence_test.cpp): |a - b| <= 1e-5 |b| + 1e-3 lr for all but 0.05% of the
// elements, none beyond 1% of lr * steps, GPT-2's gradient-free key bias skipped.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "loom/model/param_layout.h"

namespace loom::testing {

inline void expect_weights_close(const std::vector<float>& a, const model::ParamLayout& a_layout,
                                 const std::vector<float>& ref, const model::ParamLayout& ref_layout,
                                 double lr, double steps, const std::string& what) {
  int64_t over = 0, total = 0;
  for (const auto& p : ref_layout.params()) {
    const bool key_bias = p.name.find("attn.c_attn.bias") != std::string::npos;
    const int64_t C = key_bias ? p.numel() / 3 : 0;
    const int64_t oa = a_layout.get(p.name).offset;
    for (int64_t i = 0; i < p.numel(); ++i) {
      if (key_bias && i >= C && i < 2 * C) continue;
      ++total;
      const double x = a[size_t(oa + i)], y = ref[size_t(p.offset + i)];
      const double d = std::abs(x - y);
      if (d > 1e-5 * std::abs(y) + 1e-3 * lr) ++over;
      if (d > 1e-2 * lr * steps)
        ADD_FAILURE() << what << ": " << p.name << "[" << i << "] = " << x << ", single process " << y;
    }
  }
  EXPECT_LE(over, total / 2000) << what << ": " << over << " of " << total
                                << " weights outside 1e-5 relative + 1e-3 lr";
}

}  // namespace loom::testing
