// The vectorisable scalar math of vec_math.h against libm in double: exp within 2 ulp on its
// range, the divide-free reciprocal within 1 ulp over sigmoid's denominators [1, 8e37] (clamped
// above, NaN kept), and sigmoid within 4 ulp where its value is a normal float. SwiGLU's kernels
// on every ISA are compared with the f64 reference in isa_agreement_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "loom/kernels/cpu/vec_math.h"

using namespace loom::cpu;

namespace {
double ulps(double got, double want) { return std::fabs(got - want) / (std::fabs(want) * 0x1p-23); }
}  // namespace

TEST(VecMath, ExpWithinTwoUlp) {
  double worst = 0;
  for (double x = -87.0; x < 88.0; x += 0.00173) worst = std::max(worst, ulps(exp_f32(float(x)), std::exp(float(x))));
  EXPECT_LT(worst, 2.0);
}

TEST(VecMath, ReciprocalWithinOneUlpWithoutADivide) {
  double worst = 0, at = 0;
  for (double d = 1; d <= 8e37; d *= 1.000013) {
    const float f = float(d);
    const double e = ulps(recip_f32(f), 1.0 / double(f));
    if (e > worst) worst = e, at = f;
  }
  EXPECT_LE(worst, 1.0) << "at d=" << at;
  for (float p : {1.0f, 2.0f, 4.0f, 1024.0f}) EXPECT_EQ(recip_f32(p), 1.0f / p);
  EXPECT_NEAR(recip_f32(1e38f), 1.25e-38f, 1e-44f);  // clamped at 8e37: no subnormal estimate
  EXPECT_TRUE(std::isnan(recip_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, SigmoidMatchesLibm) {
  double worst = 0;
  for (double x = -80; x < 80; x += 0.0031) {
    const double want = 1.0 / (1.0 + std::exp(-double(float(x))));
    worst = std::max(worst, ulps(vsigmoid<float>(float(x)), want));
  }
  EXPECT_LT(worst, 4.0);
  EXPECT_TRUE(std::isnan(vsigmoid<float>(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(vsigmoid<float>(90.0f), 1.0f);
  EXPECT_LT(vsigmoid<float>(-90.0f), 2e-38f);
}
