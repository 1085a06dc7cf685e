// 1-bit compression: per-block scales, sign bits, and the error feedback identity
// decoded + error == input.
#include "loom/comm/onebit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace loom::comm;

TEST(OneBitCompression, DecodedPlusErrorIsTheInputAndScalesArePerBlock) {
  const int64_t n = kOneBitBlock + 8 * 5;  // a full block and a short one
  std::vector<float> x(static_cast<size_t>(n)), err(static_cast<size_t>(n)), dec(static_cast<size_t>(n), 0.f);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = i < kOneBitBlock ? d(rng) * 1e-3f : d(rng) + 5.f;
  std::vector<uint8_t> msg(size_t(onebit_message_bytes(n)));
  EXPECT_EQ(onebit_message_bytes(n), 4 * 2 + n / 8);
  onebit_compress(x.data(), n, msg.data(), err.data());
  onebit_accumulate(msg.data(), n, dec.data());
  double ss0 = 0, ss1 = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(dec[size_t(i)] + err[size_t(i)], x[size_t(i)], 1e-6 * std::abs(dec[size_t(i)])) << i;
    EXPECT_EQ(dec[size_t(i)] >= 0, x[size_t(i)] >= 0) << i;
    (i < kOneBitBlock ? ss0 : ss1) += double(x[size_t(i)]) * x[size_t(i)];
  }
  // Each block decodes to +-its own RMS: the small block is not swamped by the large one.
  EXPECT_NEAR(std::abs(dec[0]), std::sqrt(ss0 / kOneBitBlock), 1e-7);
  EXPECT_NEAR(std::abs(dec[size_t(n - 1)]), std::sqrt(ss1 / 40), 1e-4);
}

TEST(OneBitCompression, ErrorFeedbackMakesTheRunningMeanConverge) {
  // Compressing a constant vector again and again with the error carried over: the mean of
  // the decoded vectors approaches the input (the error stays bounded).
  const int64_t n = 64;
  std::vector<float> x(static_cast<size_t>(n)), err(static_cast<size_t>(n), 0.f), sum(static_cast<size_t>(n), 0.f);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(std::sin(double(i))) * (1 + float(i % 7));
  std::vector<uint8_t> msg(size_t(onebit_message_bytes(n)));
  const int T = 2000;
  for (int t = 0; t < T; ++t) {
    std::vector<float> in(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) in[size_t(i)] = x[size_t(i)] + err[size_t(i)];
    onebit_compress(in.data(), n, msg.data(), err.data());
    onebit_accumulate(msg.data(), n, sum.data());
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(sum[size_t(i)] / T, x[size_t(i)], 0.02) << i;
}
