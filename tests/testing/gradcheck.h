// Test helpers: random f64 tensors and central finite differences for gradient checks.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "loom/core/tensor.h"

namespace loom::testing {

inline Tensor randn(const Shape& s, std::mt19937& g, double scale = 1.0, DType dt = DType::f64) {
  Tensor t = Tensor::empty(s, dt);
  std::normal_distribution<double> d(0.0, scale);
  if (dt == DType::f64)
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(g);
  else
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(d(g));
  return t;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Checks analytic gradient `grad` of scalar `loss()` with respect to `x` by central
// differences (step h) at up to `max_points` evenly spread elements.
inline void expect_grad_close(const char* what, const Tensor& x, const Tensor& grad,
                              const std::function<double()>& loss, double h = 1e-6, double rtol = 1e-6,
                              double atol = 1e-8, int max_points = 64) {
  double* xp = x.data<double>();
  const int64_t n = x.numel();
  const int64_t step = std::max<int64_t>(1, n / max_points);
  for (int64_t i = 0; i < n; i += step) {
    const double old = xp[i];
    xp[i] = old + h;
    const double lp = loss();
    xp[i] = old - h;
    const double lm = loss();
    xp[i] = old;
    const double num = (lp - lm) / (2 * h);
    const double ana = grad.data<double>()[i];
    EXPECT_NEAR(ana, num, atol + rtol * std::max(std::abs(num), std::abs(ana)))
        << what << " element " << i << " of " << x.shape().str();
  }
}

}  // namespace loom::testing
