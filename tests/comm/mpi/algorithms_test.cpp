// The collective algorithms (ring, tree, hierarchical, auto) against the MPI library's own
// collectives: bitwise on integer-valued data (every summation order gives the same
// result), within reduction-order tolerance on random data, and bitwise identical on every
// rank. ctest runs them on 2, 3, 4 and 8 ranks, and with LOOM_COMM_RANKS_PER_HOST to make
// two hosts (uniform and not) out of one machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include <unistd.h>

#include "comm/mpi/mpi_world.h"

using namespace loom;
using namespace loom::comm;

namespace {

const Algorithm kAlgorithms[] = {Algorithm::ring, Algorithm::tree, Algorithm::hierarchical, Algorithm::auto_select};

// A group of its own, so the algorithm set here does not leak into other tests (a split is
// collective: every rank makes it at the same point of the same test).
Group algo_group() { return test_world().split(0, test_world().rank(), "algo"); }

// Rank- and index-dependent integers, small enough that every partial sum is exact in
// the dtype (bf16 has 8 significant bits: values up to 8, at most 8 ranks, sum <= 64... 128).
Tensor integer_data(DType t, int64_t n, int rank, int salt) {
  Tensor x = Tensor::empty({n}, t);
  for (int64_t i = 0; i < n; ++i) {
    int v = int((i * 7 + rank * 13 + salt * 5) % (t == DType::bf16 || t == DType::u8 ? 9 : 1000)) -
            (t == DType::u8 ? 0 : 2);
    switch (t) {
      case DType::f32: x.data<float>()[i] = float(v); break;
      case DType::f64: x.data<double>()[i] = double(v); break;
      case DType::i32: x.data<int32_t>()[i] = v; break;
      case DType::i64: x.data<int64_t>()[i] = v; break;
      case DType::u8: x.data<uint8_t>()[i] = uint8_t(v); break;
      case DType::bf16: x.data<bf16_t>()[i] = f32_to_bf16(float(v)); break;
      default: break;
    }
  }
  return x;
}

Tensor random_f32(int64_t n, int rank, int salt) {
  std::mt19937 rng(uint32_t(rank * 1000 + salt));
  std::normal_distribution<float> d(0.f, 1.f);
  Tensor x = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = d(rng);
  return x;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The three collectives run with `a` on copies of `x`-shaped inputs; results by op.
struct Results {
  Tensor all_reduce, reduce_scatter, all_gather;
};

Results run_all(const Group& g, Algorithm a, DType t, int64_t chunk, ReduceOp op, bool integer, int salt) {
  const int n = g.size(), r = g.rank();
  g.set_algorithm(a);
  auto data = [&](int64_t len) { return integer ? integer_data(t, len, r, salt) : random_f32(len, r, salt); };
  Results out;
  out.all_reduce = data(chunk * n + 3);  // not a multiple of the size: uneven ring spans
  g.all_reduce(out.all_reduce, op);
  Tensor rs_in = data(chunk * n);
  out.reduce_scatter = Tensor::zeros({chunk}, t);
  g.reduce_scatter(rs_in, out.reduce_scatter, op);
  Tensor ag_in = data(chunk);
  out.all_gather = Tensor::zeros({chunk * n}, t);
  g.all_gather(ag_in, out.all_gather);
  return out;
}

// Whether every rank holds the same bytes in `x` (gathered and compared on each rank).
bool identical_on_every_rank(const Group& g, const Tensor& x) {
  Tensor bytes = Tensor::borrow(x.raw(), {int64_t(x.nbytes())}, DType::u8);
  Tensor all = Tensor::zeros({int64_t(x.nbytes()) * g.size()}, DType::u8);
  g.set_algorithm(Algorithm::mpi);
  g.all_gather(bytes, all);
  for (int q = 0; q < g.size(); ++q)
    if (std::memcmp(all.data<uint8_t>() + size_t(q) * x.nbytes(), x.raw(), x.nbytes()) != 0) return false;
  return true;
}

}  // namespace

TEST(CollectiveAlgorithms, IntegerDataMatchesMpiBitwiseForEveryDtypeOpAndSize) {
  const Group g = algo_group();
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::u8}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
      if (t == DType::bf16 && (op == ReduceOp::max || op == ReduceOp::min)) continue;
      if (t == DType::u8 && op != ReduceOp::max && op != ReduceOp::min) continue;  // u8 sums wrap
      for (int64_t chunk : {int64_t(1), int64_t(5), int64_t(1000)}) {
        Results want = run_all(g, Algorithm::mpi, t, chunk, op, true, int(chunk));
        for (Algorithm a : kAlgorithms) {
          SCOPED_TRACE(testing::Message()
                       << algorithm_name(a) << " " << dtype_name(t) << " " << reduce_op_name(op) << " chunk " << chunk);
          Results got = run_all(g, a, t, chunk, op, true, int(chunk));
          EXPECT_TRUE(same_bytes(got.all_reduce, want.all_reduce)) << "all_reduce";
          EXPECT_TRUE(same_bytes(got.reduce_scatter, want.reduce_scatter)) << "reduce_scatter";
          EXPECT_TRUE(same_bytes(got.all_gather, want.all_gather)) << "all_gather";
        }
      }
    }
  }
}

TEST(CollectiveAlgorithms, RandomDataWithinReductionOrderToleranceAndSameOnEveryRank) {
  const Group g = algo_group();
  const int64_t chunk = 4099;
  Results want = run_all(g, Algorithm::mpi, DType::f32, chunk, ReduceOp::sum, false, 1);
  for (Algorithm a : kAlgorithms) {
    SCOPED_TRACE(algorithm_name(a));
    Results got = run_all(g, a, DType::f32, chunk, ReduceOp::sum, false, 1);
    for (auto [x, y] : {std::pair{got.all_reduce, want.all_reduce}, {got.reduce_scatter, want.reduce_scatter}}) {
      double worst = 0;
      for (int64_t i = 0; i < x.numel(); ++i)
        worst = std::max(worst, double(std::abs(x.data<float>()[i] - y.data<float>()[i])));
      // Sums of g.size() N(0,1) values: reordering changes them by a few ulps of ~sqrt(n).
      EXPECT_LT(worst, 1e-5 * g.size());
    }
    EXPECT_TRUE(same_bytes(got.all_gather, want.all_gather));
    EXPECT_TRUE(identical_on_every_rank(g, got.all_reduce)) << "ranks disagree on the all-reduce";
  }
}

TEST(CollectiveAlgorithms, InPlaceAllGatherAndMultiDimensionalTensors) {
  const Group g = algo_group();
  for (Algorithm a : kAlgorithms) {
    g.set_algorithm(a);
    Tensor out = Tensor::zeros({g.size(), 3}, DType::f32);
    Tensor mine = out.narrow0(g.rank(), 1);
    mine.fill(g.rank() + 1.0);
    g.all_gather(mine.view({3}), out.view({g.size() * 3}));
    for (int q = 0; q < g.size(); ++q)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(out.data<float>()[q * 3 + j], float(q + 1)) << algorithm_name(a);
    Tensor grid = Tensor::empty({2, 2, 5}, DType::f32);
    grid.fill(1.0);
    g.all_reduce(grid);
    for (int64_t i = 0; i < grid.numel(); ++i) EXPECT_EQ(grid.data<float>()[i], float(g.size()));
  }
}

TEST(CollectiveAlgorithms, SplitGroupsInheritTheAlgorithmAndResolveFallbacks) {
  const Group g = algo_group();
  g.set_algorithm(Algorithm::tree);
  Group half = g.split(g.rank() % 2, g.rank());
  EXPECT_EQ(half.algorithm(), Algorithm::tree);
  Tensor t = Tensor::empty({7}, DType::f32);
  t.fill(1.0);
  half.all_reduce(t);
  EXPECT_EQ(t.data<float>()[6], float(half.size()));
  // Recursive halving needs a power of two: other sizes run the ring.
  g.set_algorithm(Algorithm::tree);
  bool pow2 = (g.size() & (g.size() - 1)) == 0;
  EXPECT_EQ(g.algorithm_for(CollectiveOp::reduce_scatter, 1 << 20), pow2 ? Algorithm::tree : Algorithm::ring);
  // Hierarchical needs several hosts with equal rank counts and more than one rank each.
  g.set_algorithm(Algorithm::hierarchical);
  Topology topo{g.host_of()};
  bool hier = topo.hosts() > 1 && topo.uniform_local_size() > 1;
  EXPECT_EQ(g.algorithm_for(CollectiveOp::all_reduce, 1 << 20), hier ? Algorithm::hierarchical : Algorithm::ring);
}

TEST(CollectiveAlgorithms, HostsFollowRanksPerHostOrTheMachines) {
  const Group& g = test_world();
  std::vector<int> hosts = g.host_of();
  ASSERT_EQ(int(hosts.size()), g.size());
  if (const char* v = std::getenv("LOOM_COMM_RANKS_PER_HOST")) {
    int k = std::atoi(v);
    for (int r = 0; r < g.size(); ++r) EXPECT_EQ(hosts[size_t(r)], r / k);
    EXPECT_EQ(g.hosts(), (g.size() + k - 1) / k);
    return;
  }
  // Two ranks share a host exactly when their machines' (or namespaces') names agree.
  char name[64] = {};
  gethostname(name, sizeof name - 1);
  Tensor mine = Tensor::borrow(name, {64}, DType::u8);
  Tensor all = Tensor::zeros({64 * g.size()}, DType::u8);
  g.all_gather(mine, all);
  const char* names = reinterpret_cast<const char*>(all.data<uint8_t>());
  for (int a = 0; a < g.size(); ++a)
    for (int b = 0; b < g.size(); ++b)
      EXPECT_EQ(hosts[size_t(a)] == hosts[size_t(b)], std::strncmp(names + 64 * a, names + 64 * b, 64) == 0)
          << "ranks " << a << " and " << b;
}
