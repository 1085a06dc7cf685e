// Pipeline partitioners: uniform splits, the exact balanced split (checked against brute
// force), parameter costs of GPT-2 124M, and the refusal of more stages than blocks.
#include <gtest/gtest.h>

#include <functional>

#include "loom/core/error.h"
#include "loom/parallel/partition.h"

using namespace loom;
using namespace loom::parallel;

TEST(Partition, UniformSplitsGiveExtraBlocksToTheFirstStages) {
  EXPECT_EQ(partition_uniform(12, 4), (std::vector<StageRange>{{0, 3}, {3, 6}, {6, 9}, {9, 12}}));
  EXPECT_EQ(partition_uniform(10, 4), (std::vector<StageRange>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(partition_uniform(2, 2), (std::vector<StageRange>{{0, 1}, {1, 2}}));
  try {
    partition_uniform(4, 5);
    ADD_FAILURE() << "5 stages for 4 blocks should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pp=5 exceeds model.n_layer=4"), std::string::npos) << e.what();
  }
}

// Smallest possible largest stage cost, by trying every split.
static double brute_force(const PartitionCosts& c, int p) {
  const int L = int(c.block.size());
  double best = 1e300;
  std::vector<StageRange> cur;
  std::function<void(int, int)> go = [&](int stage, int first) {
    if (stage == p - 1) {
      cur.push_back({first, L});
      double mx = 0;
      for (double v : stage_costs(cur, c)) mx = std::max(mx, v);
      best = std::min(best, mx);
      cur.pop_back();
      return;
    }
    for (int last = first + 1; last <= L - (p - 1 - stage); ++last) {
      cur.push_back({first, last});
      go(stage + 1, last);
      cur.pop_back();
    }
  };
  go(0, 0);
  return best;
}

TEST(Partition, BalancedSplitIsOptimal) {
  uint64_t seed = 7;
  auto rnd = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return double((seed >> 33) % 1000) / 100.0 + 0.1;
  };
  for (int L = 1; L <= 8; ++L)
    for (int p = 1; p <= std::min(L, 4); ++p)
      for (int trial = 0; trial < 5; ++trial) {
        PartitionCosts c;
        for (int l = 0; l < L; ++l) c.block.push_back(rnd());
        c.embedding = rnd();
        c.head = 3 * rnd();
        const auto ranges = partition_balanced(c, p);
        ASSERT_EQ(int(ranges.size()), p);
        EXPECT_EQ(ranges.front().first_layer, 0);
        EXPECT_EQ(ranges.back().last_layer, L);
        for (size_t s = 0; s < ranges.size(); ++s) {
          EXPECT_GE(ranges[s].num_layers(), 1);
          if (s) {
            EXPECT_EQ(ranges[s].first_layer, ranges[s - 1].last_layer);
          }
        }
        double mx = 0;
        for (double v : stage_costs(ranges, c)) mx = std::max(mx, v);
        EXPECT_NEAR(mx, brute_force(c, p), 1e-9) << "L=" << L << " p=" << p;
      }
}

TEST(Partition, ParameterCostsOfGpt2Balance4Stages) {
  const PartitionCosts c = parameter_costs(model::preset("gpt2-124m"));
  ASSERT_EQ(c.block.size(), 12u);
  EXPECT_EQ(c.block[0], 7087872.0);                      // 12 C^2 + 13 C
  EXPECT_EQ(c.embedding, double((50257 + 1024) * 768));  // token + position tables
  EXPECT_EQ(c.head, double(2 * 768 + 50257 * 768));      // ln_f + the tied head's copy
  const double uniform = max_over_mean(stage_costs(partition_uniform(12, 4), c));
  const auto bal = partition_balanced(c, 4);
  const double balanced = max_over_mean(stage_costs(bal, c));
  EXPECT_LT(balanced, uniform);
  EXPECT_LT(bal.front().num_layers(), bal[1].num_layers());  // the embedding stage owns fewer blocks
  EXPECT_LT(bal.back().num_layers(), bal[2].num_layers());
}

TEST(Partition, NamesAreChecked) {
  EXPECT_EQ(partition_method_from_name("profile"), PartitionMethod::profile);
  EXPECT_THROW(partition_method_from_name("greedy"), Error);
}
