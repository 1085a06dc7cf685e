// The sampler alone: greedy and its tie-break, top-k and top-p truncation, draws that follow
// the softmax, and draws that depend only on (seed, position).
#include <gtest/gtest.h>

#include <cmath>

#include "loom/infer/sampler.h"

using namespace loom::infer;

TEST(Sampler, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  std::vector<std::pair<float, int32_t>> scratch;
  SamplingParams p;
  p.temperature = 0;
  const std::vector<float> l{0.1f, 2.f, -1.f, 2.f};
  EXPECT_EQ(sample_token(l.data(), 4, p, 0.99f, scratch), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::vector<std::pair<float, int32_t>> scratch;
  const std::vector<float> l{0.3f, 0.1f, 0.5f, 0.45f};
  SamplingParams k1;
  k1.top_k = 1;
  SamplingParams p0;
  p0.top_p = 1e-6;
  for (float u : {0.f, 0.3f, 0.999f}) {
    EXPECT_EQ(sample_token(l.data(), 4, k1, u, scratch), 2);
    EXPECT_EQ(sample_token(l.data(), 4, p0, u, scratch), 2);
  }
}

TEST(Sampler, DrawsFollowTheTruncatedSoftmax) {
  std::vector<std::pair<double, int32_t>> scratch;
  const std::vector<double> l{std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.4)};
  auto freq = [&](const SamplingParams& p) {
    std::vector<double> f(4, 0.0);
    const int n = 20000;
    for (int i = 0; i < n; ++i) f[size_t(sample_token(l.data(), 4, p, sampling_draw(9, i), scratch))] += 1.0 / n;
    return f;
  };
  SamplingParams plain;
  auto f = freq(plain);
  for (int v = 0; v < 4; ++v) EXPECT_NEAR(f[size_t(v)], 0.1 * (v + 1), 0.015) << v;
  SamplingParams k2;
  k2.top_k = 2;  // keeps 0.3 and 0.4
  f = freq(k2);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[3], 0.4 / 0.7, 0.015);
  SamplingParams p6;
  p6.top_p = 0.6;  // 0.4 + 0.3 reaches 0.6
  f = freq(p6);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[2], 0.3 / 0.7, 0.015);
  SamplingParams hot;
  hot.temperature = 2.0;  // flattens: p ~ sqrt(0.1 .. 0.4)
  f = freq(hot);
  double z = 0;
  for (int v = 0; v < 4; ++v) z += std::sqrt(0.1 * (v + 1));
  for (int v = 0; v < 4; ++v) EXPECT_NEAR(f[size_t(v)], std::sqrt(0.1 * (v + 1)) / z, 0.015);
}

TEST(Sampler, DrawsArePureFunctionsOfSeedAndPosition) {
  EXPECT_EQ(sampling_draw(5, 17), sampling_draw(5, 17));
  EXPECT_NE(sampling_draw(5, 17), sampling_draw(5, 18));
  EXPECT_NE(sampling_draw(5, 17), sampling_draw(6, 17));
}

TEST(Sampler, ValidationNamesTheParameter) {
  auto msg = [](SamplingParams p) {
    try {
      p.validate();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SamplingParams p;
  EXPECT_EQ(msg(p), "");
  p.temperature = -1;
  EXPECT_EQ(msg(p).rfind("[sampling] temperature", 0), 0u);
  p = {};
  p.top_k = -3;
  EXPECT_EQ(msg(p).rfind("[sampling] top_k", 0), 0u);
  p = {};
  p.top_p = 1.01;
  EXPECT_EQ(msg(p).rfind("[sampling] top_p", 0), 0u);
  p.top_p = std::nan("");
  EXPECT_EQ(msg(p).rfind("[sampling] top_p", 0), 0u);
  p = {};
  p.stop_token_ids = {-2};
  EXPECT_EQ(msg(p).rfind("[sampling] stop_token_ids", 0), 0u);
}
