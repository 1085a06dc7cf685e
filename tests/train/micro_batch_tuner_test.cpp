// parallel.micro_batches=auto's tuner on modelled step times: a 1F1B pipeline of p stages whose
// micro-batch of b sequences takes alpha + beta b on every stage, so a step at m micro-batches of
// G / m sequences takes (m + p - 1)(alpha + beta G / m), of which (p - 1)(alpha + beta G / m) is
// bubble. From every start, with and without noise, the tuner settles within 5% of the best
// candidate (issue #41's target for the measured runs), says why it moved, and only moves among
// the candidates it was given.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "loom/core/error.h"
#include "loom/train/micro_batch_tuner.h"

using loom::train::MicroBatchTuner;

namespace {

struct Pipeline {
  int p = 4;
  double alpha = 0.02, beta = 0.01, G = 64;
  double step(int64_t m) const { return double(m + p - 1) * (alpha + beta * G / double(m)); }
  double bubble(int64_t m) const { return double(p - 1) * (alpha + beta * G / double(m)); }
};

// Runs the tuner to its decision; returns the settled count and the steps it took.
std::pair<int64_t, int> tune(const Pipeline& pipe, const std::vector<int64_t>& cand, int64_t start, double noise,
                             uint64_t seed, std::vector<std::string>* reasons = nullptr) {
  MicroBatchTuner t(cand, start);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0, noise);
  int steps = 0;
  while (!t.settled() && steps < 200) {
    const int64_t m = t.current();
    const double f = 1 + n(rng);
    if (auto c = t.observe(pipe.step(m) * f, pipe.bubble(m) * f)) {
      EXPECT_TRUE(std::count(cand.begin(), cand.end(), c->m)) << c->m;
      EXPECT_FALSE(c->reason.empty());
      if (reasons) reasons->push_back(c->reason);
    }
    ++steps;
  }
  EXPECT_TRUE(t.settled());
  return {t.current(), steps};
}

const std::vector<int64_t> kDivisors64 = {1, 2, 4, 8, 16, 32, 64};

}  // namespace

TEST(MicroBatchTuner, SettlesNearTheBestFromEveryStart) {
  for (const Pipeline pipe : {Pipeline{4, 0.02, 0.01, 64}, Pipeline{2, 0.05, 0.002, 64}, Pipeline{8, 0.001, 0.01, 64},
                              Pipeline{1, 0.03, 0.01, 64}}) {
    double best = 1e30;
    for (int64_t m : kDivisors64) best = std::min(best, pipe.step(m));
    for (int64_t start : kDivisors64)
      for (double noise : {0.0, 0.01}) {
        const auto [m, steps] = tune(pipe, kDivisors64, start, noise, uint64_t(start) * 7 + 1);
        EXPECT_LE(pipe.step(m), 1.05 * best) << "p=" << pipe.p << " alpha=" << pipe.alpha << " start=" << start
                                             << " noise=" << noise << ": settled on " << m;
        EXPECT_LE(steps, 4 * 7) << "every candidate measured at most once";
      }
  }
}

TEST(MicroBatchTuner, ABubbleSendsItUpAndNoBubbleDown) {
  std::vector<std::string> why;
  // p=4 at m=2: the bubble is 3/5 of the step; more micro-batches come first.
  tune(Pipeline{4, 0.02, 0.01, 64}, kDivisors64, 2, 0, 1, &why);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why[0].find("2 micro-batches took"), std::string::npos) << why[0];
  EXPECT_NE(why[0].find("60% of it pipeline bubble: trying more, 4"), std::string::npos) << why[0];
  EXPECT_NE(why.back().find("settled on"), std::string::npos) << why.back();
  // One stage: no bubble; fewer, larger micro-batches first (alpha makes each cost).
  why.clear();
  const auto [m, steps] = tune(Pipeline{1, 0.03, 0.01, 64}, kDivisors64, 8, 0, 1, &why);
  EXPECT_NE(why[0].find("0% of it pipeline bubble: trying fewer and larger ones, 4"), std::string::npos) << why[0];
  EXPECT_EQ(m, 1);
}

TEST(MicroBatchTuner, TurnsWhenTheFirstMoveDoesNotHelp) {
  // The best is below the start although the bubble points up: the tuner tries 8, finds it
  // slower, and turns to 2 and then 1.
  Pipeline pipe{2, 0.2, 0.001, 64};
  std::vector<std::string> why;
  const auto [m, steps] = tune(pipe, kDivisors64, 4, 0, 1, &why);
  EXPECT_EQ(m, 1);
  bool turned = false;
  for (const auto& w : why)
    turned |=
        w.find("not 2% faster than 4's") != std::string::npos && w.find("trying the other way, 2") != std::string::npos;
  EXPECT_TRUE(turned) << why.size();
}

TEST(MicroBatchTuner, StaysAmongItsCandidatesAndChecksTheStart) {
  // Memory allows at most 8 micro-batches' worth of small ones here: 16 and up are not offered.
  const auto [m, steps] = tune(Pipeline{8, 0.001, 0.01, 64}, {2, 4, 8}, 2, 0, 1);
  EXPECT_EQ(m, 8);
  EXPECT_THROW(MicroBatchTuner({2, 4}, 3), loom::Error);
  MicroBatchTuner single({4}, 4);
  const auto c = single.observe(1, 0.5);
  EXPECT_FALSE(c.has_value());  // the first step settles shapes and is not counted
  for (int i = 0; i < 3; ++i) {
    if (auto d = single.observe(1, 0.5)) {
      EXPECT_EQ(d->m, 4);
    }
  }
  EXPECT_TRUE(single.settled());
}
