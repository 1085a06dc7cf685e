// The loss guards' detectors on synthetic curves: a healthy, noisy, falling curve never spikes
// or diverges; one bad batch is a spike and stays out of the window; a curve that climbs to more
// than twice its minimum diverges after exactly divergence_steps steps above it, and names the
// last healthy step before the climb; a short excursion does not diverge. The trainer's use of
// them (rollback, counting, stopping, checkpoints left behind) is in guard_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "loom/train/loss_guard.h"

using namespace loom::train;

namespace {

// A training curve: exponential decay from 10 towards 2, with 2% multiplicative noise.
std::vector<double> healthy_curve(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, 0.02);
  std::vector<double> out;
  for (int i = 0; i < n; ++i) out.push_back((2 + 8 * std::exp(-i / 150.0)) * (1 + noise(rng)));
  return out;
}

}  // namespace

TEST(LossGuard, HealthyCurveNeitherSpikesNorDiverges) {
  for (uint64_t seed : {1, 2, 3}) {
    SpikeDetector spikes(6, 50);
    DivergenceDetector div(2, 25);
    const std::vector<double> curve = healthy_curve(2000, seed);
    double max_z = 0;
    for (size_t i = 0; i < curve.size(); ++i) {
      const SpikeVerdict v = spikes.observe(curve[i]);
      EXPECT_FALSE(v.spike) << "step " << i + 1 << " z " << v.z;
      max_z = std::max(max_z, v.z);
      EXPECT_FALSE(div.observe(int64_t(i) + 1, curve[i])) << "step " << i + 1;
    }
    EXPECT_GT(max_z, 1) << "the z-scores were never computed";
    EXPECT_LT(div.max_ratio(), 1.1);
    EXPECT_EQ(div.longest_above(), 0);
    EXPECT_TRUE(div.healthy());
    EXPECT_EQ(div.last_healthy_step(), 2000);
  }
}

TEST(LossGuard, OneBadBatchIsASpikeAndStaysOutOfTheWindow) {
  SpikeDetector d(6, 20);
  const std::vector<double> curve = healthy_curve(60, 7);
  for (double l : curve) ASSERT_FALSE(d.observe(l).spike);
  const SpikeVerdict v = d.observe(curve.back() * 3);
  EXPECT_TRUE(v.spike);
  EXPECT_GT(v.z, 6);
  EXPECT_EQ(v.window, 20u);
  // The spike did not join the window: the next normal loss is judged against the same median.
  const SpikeVerdict next = d.observe(curve.back());
  EXPECT_FALSE(next.spike);
  EXPECT_DOUBLE_EQ(next.median, v.median);
  // Fewer than three losses judge nothing; from three on, the spread is at least 1% of the mean.
  d.clear();
  EXPECT_FALSE(d.observe(2.0).spike);
  EXPECT_FALSE(d.observe(2.0).spike);
  EXPECT_FALSE(d.observe(100).spike) << "judged on two losses";
  d.clear();
  for (int i = 0; i < 3; ++i) d.observe(2.0);
  EXPECT_TRUE(d.observe(2.2).spike) << "a 10% rise over a flat start is 10 floors: a spike";
  EXPECT_FALSE(d.observe(2.1).spike) << "a 5% rise is 5 floors: not a spike";
  // z = 0 turns the detector off.
  SpikeDetector off(0, 20);
  for (double l : curve) off.observe(l);
  EXPECT_FALSE(off.observe(1e6).spike);
}

TEST(LossGuard, AClimbDivergesAfterExactlyDivergenceStepsAboveTheFactor) {
  DivergenceDetector d(2, 25);
  // Falls from 6 to 3 over 100 steps, flat at 3 until step 200, then climbs 5% a step.
  double loss = 0;
  int64_t first_above = -1, diverged = -1, doubled = -1;
  for (int64_t s = 1; s <= 400 && diverged < 0; ++s) {
    loss = s <= 100 ? 6 - 3 * double(s) / 100 : s <= 200 ? 3 : 3 * std::pow(1.05, double(s - 200));
    if (doubled < 0 && loss > 6) doubled = s;
    const bool v = d.observe(s, loss);
    if (first_above < 0 && d.above_since() > 0) first_above = d.above_since();
    if (v) diverged = s;
  }
  ASSERT_GT(diverged, 0) << "a loss growing 5% a step never diverged";
  EXPECT_EQ(diverged - first_above + 1, 25) << "not exactly guard.divergence_steps steps above the factor";
  EXPECT_NEAR(d.minimum(), 3, 0.01);
  EXPECT_LE(d.last_healthy_step(), doubled - 1) << "the divergence is said to begin after the loss doubled";
  EXPECT_GE(d.last_healthy_step(), 200) << "the flat stretch was healthy";
  EXPECT_FALSE(d.healthy());
  EXPECT_LT(diverged - doubled, 100);
}

TEST(LossGuard, AShortExcursionAboveTheFactorDoesNotDiverge) {
  DivergenceDetector d(2, 25);
  for (int64_t s = 1; s <= 100; ++s) ASSERT_FALSE(d.observe(s, 3));
  // 5 steps at 10x: the smoothed loss climbs to 14 and stays above 6 for 16 steps, fewer than 25.
  int64_t above = 0;
  for (int64_t s = 101; s <= 300; ++s) {
    const double loss = s <= 105 ? 30 : 3;
    EXPECT_FALSE(d.observe(s, loss)) << "step " << s;
    above = std::max(above, d.steps_above());
  }
  EXPECT_GT(above, 10) << "the excursion did not go above the factor: the test shows nothing";
  EXPECT_LT(d.longest_above(), 25);
  EXPECT_TRUE(d.healthy());
  // After restart(250) (a rollback to step 250) the smoothing starts again from the next loss, the
  // minimum stays, and no step of the abandoned trajectory is the last healthy one.
  d.restart(250);
  EXPECT_EQ(d.last_healthy_step(), 250);
  EXPECT_FALSE(d.observe(251, 5));
  EXPECT_DOUBLE_EQ(d.smoothed(), 5);
  EXPECT_NEAR(d.minimum(), 3, 1e-9);
}

// A fine-tune that memorises its data: the loss wanders between 0.01 and 0.08 nats, many times
// its minimum, yet far below the 0.1-nat floor the factor multiplies; a climb from there to 1 is
// a divergence.
TEST(LossGuard, ALossNearZeroIsJudgedAgainstAFloor) {
  DivergenceDetector d(2, 25);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.01, 0.08);
  for (int64_t s = 1; s <= 500; ++s) ASSERT_FALSE(d.observe(s, u(rng))) << "step " << s;
  EXPECT_LT(d.max_ratio(), 1);
  int64_t diverged = -1;
  for (int64_t s = 501; s <= 600 && diverged < 0; ++s)
    if (d.observe(s, 1.0)) diverged = s;
  EXPECT_GT(diverged, 0) << "a climb from 0.05 to 1 nat was not a divergence";
}

TEST(LossGuard, LikelyCausesNameTheSuspiciousSettings) {
  DivergenceSuspects s;
  s.lr = 10;
  s.beta2 = 0;
  s.eps = 1e-30;
  s.warmup_steps = 0;
  const std::vector<std::string> c = likely_divergence_causes(s);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_NE(c[0].find("optim.lr=10"), std::string::npos) << c[0];
  EXPECT_NE(c[1].find("warmup"), std::string::npos) << c[1];
  EXPECT_NE(c[2].find("clipping is off"), std::string::npos) << c[2];
  EXPECT_NE(c[3].find("optim.beta2=0"), std::string::npos) << c[3];
  EXPECT_NE(c[4].find("optim.eps=1e-30"), std::string::npos) << c[4];
  DivergenceSuspects sane;
  sane.lr = 3e-4;
  sane.warmup_steps = 100;
  sane.clip_max_norm = 1;
  EXPECT_TRUE(likely_divergence_causes(sane).empty());
}
