// The topology arithmetic, the alpha-beta cost model behind `auto`, and the calibration
// file, without processes.
#include "loom/comm/algorithm.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "loom/core/error.h"

using namespace loom;
using namespace loom::comm;

namespace {

Topology two_hosts_of_two() { return Topology{{0, 0, 1, 1}}; }

// A cluster-like model: hosts 10x slower to each other than inside.
CostModel slow_links() {
  CostModel m;
  m.intra = {2e-6, 1.0 / 10e9};
  m.inter = {40e-6, 1.0 / 1e9};
  m.reduce_s_per_byte = 1.0 / 20e9;
  return m;
}

}  // namespace

TEST(Topology, GridOfHostsAndLocalIndices) {
  Topology t{{5, 5, 9, 9, 5, 9}};  // hosts interleaved: 0,1,4 on host 5; 2,3,5 on host 9
  EXPECT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.uniform_local_size(), 3);
  EXPECT_EQ(t.host_index(4), 0);
  EXPECT_EQ(t.host_index(3), 1);
  EXPECT_EQ(t.local_index(4), 2);
  EXPECT_EQ(t.local_index(5), 2);
  EXPECT_EQ(t.host_members(3), (std::vector<int>{2, 3, 5}));
  EXPECT_EQ(t.peers_across_hosts(1), (std::vector<int>{1, 3}));
  EXPECT_EQ((Topology{{0, 0, 1}}.uniform_local_size()), 0);
}

TEST(CostModel, RingIsBandwidthOptimalTreeLatencyOptimal) {
  CostModel m = slow_links();
  Topology one{{0, 0, 0, 0, 0, 0, 0, 0}};
  const int64_t small = 4 << 10, large = 256 << 20;
  // Tree: log2(8) = 3 steps of the whole message; ring: 14 steps of 1/8 of it.
  EXPECT_LT(predict_seconds(Algorithm::tree, CollectiveOp::all_reduce, small, one, m),
            predict_seconds(Algorithm::ring, CollectiveOp::all_reduce, small, one, m));
  EXPECT_LT(predict_seconds(Algorithm::ring, CollectiveOp::all_reduce, large, one, m),
            predict_seconds(Algorithm::tree, CollectiveOp::all_reduce, large, one, m));
  // The ring all-reduce moves 2(n-1)/n of the bytes per rank: its bandwidth term.
  double ring = predict_seconds(Algorithm::ring, CollectiveOp::all_reduce, large, one, m);
  double bytes_term = 2.0 * 7 / 8 * double(large) * m.intra.beta_s_per_byte;
  EXPECT_GT(ring, bytes_term);
  EXPECT_LT(ring, bytes_term * 1.5);
}

TEST(CostModel, HierarchicalWinsLargeMessagesAcrossSlowHostLinks) {
  CostModel m = slow_links();
  Topology t = two_hosts_of_two();
  const int64_t large = 256 << 20;
  double ring = predict_seconds(Algorithm::ring, CollectiveOp::all_reduce, large, t, m);
  double hier = predict_seconds(Algorithm::hierarchical, CollectiveOp::all_reduce, large, t, m);
  // Flat ring: 6 steps of n/4 over the host link (1.5 n); hierarchical: n/2 per rank
  // crosses, two ranks share the link (n): at most 1.5x, less the intra-host phases.
  EXPECT_GT(ring / hier, 1.3);
  EXPECT_LE(ring / hier, 1.5);
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, large, t, m), Algorithm::hierarchical);
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, 1024, t, m), Algorithm::tree);
  // 8 ranks per host: the flat ring's 2(n-1)/n = 1.875 against hierarchical's 2(h-1)/h = 1
  // per host plus the intra-host phases (2 x 7/8 at 10x the bandwidth): about 1.6x.
  Topology big;
  for (int r = 0; r < 16; ++r) big.host_of.push_back(r / 8);
  EXPECT_GT(predict_seconds(Algorithm::ring, CollectiveOp::all_reduce, large, big, m) /
                predict_seconds(Algorithm::hierarchical, CollectiveOp::all_reduce, large, big, m),
            1.5);
}

TEST(CostModel, AutoOnOneHostIsMpiUnlessMeasuredSlower) {
  CostModel m = slow_links();
  Topology one{{0, 0, 0, 0}};
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, 1 << 20, one, m), Algorithm::mpi);
  // A measured MPI time far above the model's ring: auto takes the ring.
  m.measured[CostModel::key(Algorithm::mpi, CollectiveOp::all_reduce, 4, 1)] = {{1 << 20, 1.0}};
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, 1 << 20, one, m), Algorithm::ring);
  // And one far below every prediction: auto takes MPI, also across hosts.
  Topology t = two_hosts_of_two();
  m.measured[CostModel::key(Algorithm::mpi, CollectiveOp::all_reduce, 4, 2)] = {{1024, 1e-9}, {1 << 30, 1e-9}};
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, 1 << 20, t, m), Algorithm::mpi);
  // A measured time of one of loom's algorithms beats the model's prediction for it.
  m.measured[CostModel::key(Algorithm::ring, CollectiveOp::all_reduce, 4, 2)] = {{1024, 1e-12}, {1 << 30, 1e-12}};
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, 1 << 20, t, m), Algorithm::ring);
  EXPECT_EQ(choose_algorithm(CollectiveOp::all_reduce, 1, Topology{std::vector<int>{0}}, m), Algorithm::mpi);
}

TEST(CostModel, MpiTimesInterpolateLogLogAndExtrapolateLinearly) {
  CostModel m;
  const Algorithm mpi = Algorithm::mpi;
  m.measured[CostModel::key(mpi, CollectiveOp::all_gather, 4, 2)] = {{1000, 1e-4}, {100000, 1e-2}};
  EXPECT_NEAR(m.measured_time(mpi, CollectiveOp::all_gather, 4, 2, 10000), 1e-3, 1e-9);
  EXPECT_NEAR(m.measured_time(mpi, CollectiveOp::all_gather, 4, 2, 200000), 2e-2, 1e-12);
  EXPECT_NEAR(m.measured_time(mpi, CollectiveOp::all_gather, 4, 2, 10), 1e-4, 1e-12);
  EXPECT_LT(m.measured_time(mpi, CollectiveOp::all_gather, 8, 2, 10000), 0);  // not measured
  EXPECT_LT(m.measured_time(Algorithm::ring, CollectiveOp::all_gather, 4, 2, 10000), 0);
}

TEST(CostModel, ResolveFallsBackWhereAnAlgorithmCannotRun) {
  CostModel m;
  EXPECT_EQ((resolve_algorithm(Algorithm::hierarchical, CollectiveOp::all_reduce, 1 << 20, Topology{{0, 0, 0}}, m)),
            Algorithm::ring);
  EXPECT_EQ((resolve_algorithm(Algorithm::hierarchical, CollectiveOp::all_reduce, 1 << 20, Topology{{0, 0, 1}}, m)),
            Algorithm::ring);
  EXPECT_EQ((resolve_algorithm(Algorithm::tree, CollectiveOp::reduce_scatter, 1 << 20, Topology{{0, 0, 1}}, m)),
            Algorithm::ring);
  EXPECT_EQ((resolve_algorithm(Algorithm::tree, CollectiveOp::all_reduce, 1 << 20, Topology{{0, 0, 1}}, m)),
            Algorithm::tree);
  EXPECT_EQ((resolve_algorithm(Algorithm::ring, CollectiveOp::all_reduce, 8, Topology{std::vector<int>{0}}, m)),
            Algorithm::mpi);
  // Recursive doubling on 3 ranks: one fold in, one step, one fold out.
  CostModel flat;
  flat.intra = {1e-6, 0};
  flat.reduce_s_per_byte = 0;
  EXPECT_NEAR(predict_seconds(Algorithm::tree, CollectiveOp::all_reduce, 1 << 20, Topology{{0, 0, 0}}, flat), 3e-6,
              1e-12);
  EXPECT_EQ(parse_algorithm("hierarchical"), Algorithm::hierarchical);
  try {
    parse_algorithm("butterfly");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[comm] comm.algorithm 'butterfly' is not one of auto, ring, tree, hierarchical, mpi");
  }
}

TEST(CostModel, CalibrationFileRoundTripsAndNamesBadLines) {
  CostModel m = slow_links();
  m.measured[CostModel::key(Algorithm::hierarchical, CollectiveOp::reduce_scatter, 4, 2)] = {{4096, 3e-5},
                                                                                             {1 << 20, 2e-3}};
  std::string path = testing::TempDir() + "/loom_calibration.txt";
  save_cost_model(m, path);
  CostModel back = load_cost_model(path);
  EXPECT_TRUE(back.calibrated);
  EXPECT_NEAR(back.inter.gbps(), 1.0, 1e-6);
  EXPECT_NEAR(back.intra.alpha_s, 2e-6, 1e-12);
  EXPECT_NEAR(back.measured_time(Algorithm::hierarchical, CollectiveOp::reduce_scatter, 4, 2, 1 << 20), 2e-3, 1e-9);
  {
    std::ofstream f(path);
    f << "intra_gbps 5\n# comment\ninter_gbps -1\n";
  }
  try {
    load_cost_model(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3: inter_gbps -1 must be a positive number"), std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(load_cost_model(path), Error);
}
