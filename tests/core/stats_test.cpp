// The one percentile definition: linear interpolation between closest ranks (NumPy's default).
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/core/stats.h"

using namespace loom;

TEST(Stats, PercentileInterpolatesBetweenClosestRanks) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // 1..100, unsorted
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 100);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 50.5);   // numpy.percentile(range(1, 101), 50)
  EXPECT_DOUBLE_EQ(percentile(v, 99), 99.01);  // numpy.percentile(range(1, 101), 99)
  EXPECT_DOUBLE_EQ(percentile(v, 25), 25.75);
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({7}), 7);
  EXPECT_EQ(median({}), 0);
  EXPECT_THROW(percentile({1.0}, 101), Error);
}
