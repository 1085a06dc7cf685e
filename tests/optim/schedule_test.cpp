// optim::LrSchedule (linear warmup, then cosine to min_lr) and the dynamic clipping threshold
// on their own, without a model.
#include <gtest/gtest.h>

#include "loom/optim/schedule.h"

using namespace loom;

TEST(LrSchedule, WarmupThenCosineToMinLr) {
  optim::LrSchedule s{1.0, 0.1, -1, 1000};
  EXPECT_EQ(s.resolved_warmup(), 100);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.01);
  EXPECT_DOUBLE_EQ(s.lr_at(99), 1.0);
  EXPECT_NEAR(s.lr_at(550), 0.55, 1e-9);
  EXPECT_NEAR(s.lr_at(999), 0.1, 1e-4);
  EXPECT_EQ((optim::LrSchedule{1.0, 0.1, -1, 500000}).resolved_warmup(), 10000);
  EXPECT_DOUBLE_EQ(optim::dynamic_clip_threshold(0, 100), 10.0);
  EXPECT_DOUBLE_EQ(optim::dynamic_clip_threshold(95, 100), 1.0);
}
