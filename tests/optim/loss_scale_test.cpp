// optim::LossScaler on its own: halving on overflow, doubling after `window` clean steps in a
// row (an overflow restarts the count), off means scale 1 and nothing skipped, and the floor.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/optim/loss_scale.h"

using namespace loom;
using namespace loom::optim;

TEST(LossScaler, HalvesOnOverflowDoublesAfterACleanWindow) {
  LossScaler s({true, 8, 3});
  EXPECT_EQ(s.scale(), 8);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // overflow: skip, halve, restart the count
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.clean_steps(), 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 4);
  EXPECT_TRUE(s.update(true));  // the third clean step in a row
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(s.clean_steps(), 0);
  s.restore(32, 2);
  EXPECT_EQ(s.scale(), 32);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 64);
}

TEST(LossScaler, OffIsScaleOneAndTheFloorIsOne) {
  LossScaler off({false, 8, 3});
  EXPECT_EQ(off.scale(), 1);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.update(false));
  EXPECT_EQ(off.scale(), 1);
  LossScaler s({true, 2, 3});
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1);
  try {
    s.update(false);
    FAIL() << "a scale below 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[train] loss scale would fall below 1"), std::string::npos) << e.what();
  }
}
