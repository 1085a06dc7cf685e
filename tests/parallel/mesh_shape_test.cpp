#include <gtest/gtest.h>

#include <set>

#include "loom/core/error.h"
#include "loom/parallel/layout.h"
#include "loom/parallel/mesh_shape.h"

using namespace loom;
using namespace loom::parallel;

TEST(MeshShape, TpIsInnermostAndGroupsPartitionTheWorld) {
  MeshShape m(2, 2, 1, 2);
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_EQ(m.group_ranks(5, Dim::tp), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(m.group_ranks(5, Dim::dp), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(m.group_ranks(5, Dim::pp), (std::vector<int64_t>{1, 5}));
  for (Dim d : {Dim::pp, Dim::dp, Dim::ep, Dim::tp}) {
    std::set<int64_t> seen;
    for (int64_t r = 0; r < 8; ++r) {
      auto g = m.group_ranks(r, d);
      EXPECT_EQ(int64_t(g.size()), m.size(d));
      EXPECT_EQ(m.group_color(r, d), g.front());
      for (int64_t x : g) EXPECT_EQ(m.group_ranks(x, d), g);  // same group from every member
      seen.insert(g.begin(), g.end());
    }
    EXPECT_EQ(seen.size(), 8u);
  }
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(m.rank_of(m.coord(r)), r);
}

TEST(MeshShape, WrongWorldSizeShowsTheArithmetic) {
  MeshShape m(1, 4, 1, 1);
  try {
    m.check_world_size(6);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 does not match pp=1 x dp=4 x ep=1 x tp=1 = 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(MeshShape(0, 1, 1, 1), Error);
}

TEST(MeshShape, OrderPutsAnotherDimensionInnermost) {
  // dp innermost: data-parallel peers are consecutive ranks (one host), tp outermost.
  MeshShape m(1, 2, 1, 4, parse_mesh_order("tp,pp,ep,dp"));
  EXPECT_EQ(m.group_ranks(5, Dim::dp), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(m.group_ranks(5, Dim::tp), (std::vector<int64_t>{1, 3, 5, 7}));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(m.rank_of(m.coord(r)), r);
  EXPECT_EQ(m.describe(), "pp=1 x dp=2 x ep=1 x tp=4 (order tp,pp,ep,dp)");
  EXPECT_EQ(MeshShape(1, 2, 1, 4).describe(), "pp=1 x dp=2 x ep=1 x tp=4");
  for (const char* bad : {"pp,dp,tp", "pp,dp,ep,tp,tp", "pp,dp,dp,tp", "pp,dp,ep,xp"}) {
    try {
      parse_mesh_order(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must name pp, dp, ep and tp once each"), std::string::npos) << e.what();
    }
  }
}

// The layout the trainer reads from parallel.* and the planner searches over makes the mesh
// (with its order) and says how many ranks share the dense and the expert parameters.
TEST(Layout, MakesItsMeshAndDataParallelRanks) {
  Layout l{.dp = 2, .tp = 4, .pp = 3, .ep = 5, .order = parse_mesh_order("tp,pp,ep,dp")};
  EXPECT_EQ(l.ranks(), 120);
  EXPECT_EQ(l.mesh().describe(), "pp=3 x dp=2 x ep=5 x tp=4 (order tp,pp,ep,dp)");
  EXPECT_EQ(l.mesh().group_ranks(1, Dim::dp), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(l.data_parallel_ranks().dp_size, 10);  // dense parameters: every rank of other data
  EXPECT_EQ(l.data_parallel_ranks().expert_dp_size, 2);
  EXPECT_EQ(mesh_order_name(l.order), "tp,pp,ep,dp");
  EXPECT_EQ(mesh_order_name(Layout{}.order), "pp,dp,ep,tp");
}
