// Under mpiexec: the progress-board keys that let a rank's watchdog read its peers' progress
// agree on every member of a group and differ between groups, including groups split with
// the same name (the board's contents are tested in tests/comm/progress_board_test.cpp).
#include <gtest/gtest.h>

#include "comm/mpi/mpi_world.h"
#include "loom/comm/record.h"

using namespace loom;
using namespace loom::comm;

namespace {

// The key this rank recorded for the last operation of `group`, gathered from every rank of
// the world.
std::vector<uint64_t> gathered_keys(const Group& world, const Group& group) {
  group.barrier();
  auto last = group.record().last_completed(group.name());
  EXPECT_TRUE(last.has_value());
  Tensor keys = Tensor::zeros({world.size()}, DType::i64);
  world.all_gather(Tensor::from_vector<int64_t>({int64_t(last ? last->group_key : 0)}, {1}), keys);
  std::vector<uint64_t> out;
  for (int i = 0; i < world.size(); ++i) out.push_back(uint64_t(keys.data<int64_t>()[i]));
  return out;
}

}  // namespace

TEST(MpiProgressBoard, GroupKeysAgreeWithinAGroupAndDifferBetweenGroups) {
  const Group& g = test_world();
  const int n = g.size();
  std::vector<uint64_t> world_keys = gathered_keys(g, g);
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(world_keys[r], 0u) << "rank " << r << ": the world group is not on the board";
    EXPECT_EQ(world_keys[r], world_keys[0]);
  }
  // Both halves are called "half": their keys must still differ.
  Group half = g.split(g.rank() % 2, g.rank(), "half");
  std::vector<uint64_t> half_keys = gathered_keys(g, half);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(half_keys[r], half_keys[r % 2]) << "rank " << r;
    EXPECT_NE(half_keys[r], world_keys[0]);
  }
  if (n > 1) {
    EXPECT_NE(half_keys[0], half_keys[1]);
  }
  // The same split twice: same name, same members, two groups.
  Group again1 = g.split(0, g.rank(), "again");
  Group again2 = g.split(0, g.rank(), "again");
  std::vector<uint64_t> k1 = gathered_keys(g, again1);
  std::vector<uint64_t> k2 = gathered_keys(g, again2);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(k1[r], k1[0]);
    EXPECT_EQ(k2[r], k2[0]);
  }
  EXPECT_NE(k1[0], k2[0]);
}
