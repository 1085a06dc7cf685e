// Every collective of comm::Group checked against its arithmetic on rank-dependent data,
// under mpiexec with any number of ranks (ctest runs 4 and 3): all dtypes, async overlap,
// split grids, uneven all_to_all_v, a send/recv ring, and errors for bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "comm/mpi/mpi_world.h"
#include "loom/comm/record.h"
#include "loom/core/timer.h"

using namespace loom;
using namespace loom::comm;

namespace {

template <class T>
Tensor iota_tensor(int64_t n, double base) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(base + double(i));
  return Tensor::from_vector(v, {n});
}

template <class T>
void check_all_reduce(const Group& g) {
  const int n = g.size(), r = g.rank();
  const int64_t m = 5;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
    Tensor t = iota_tensor<T>(m, r + 1);  // t[i] = rank + 1 + i
    g.all_reduce(t, op);
    for (int64_t i = 0; i < m; ++i) {
      double want = 0;
      switch (op) {
        case ReduceOp::sum: want = n * (n + 1) / 2.0 + double(n * i); break;
        case ReduceOp::max: want = double(n + i); break;
        case ReduceOp::min: want = double(1 + i); break;
        case ReduceOp::avg: want = (n * (n + 1) / 2.0 + double(n * i)) / n; break;
      }
      if (!std::is_floating_point_v<T>) want = std::floor(want);  // integer avg truncates
      EXPECT_EQ(double(t.data<T>()[i]), want) << dtype_name(t.dtype()) << " " << reduce_op_name(op) << " element " << i;
    }
  }
}

}  // namespace

TEST(MpiGroup, WorldIsMpiWithEveryRank) {
  const Group& g = test_world();
  EXPECT_STREQ(g.backend_name(), "mpi");
  EXPECT_GE(g.size(), 2);
  Tensor ranks = Tensor::zeros({g.size()}, DType::i32);
  Tensor mine = Tensor::from_vector<int32_t>({g.rank()}, {1});
  g.all_gather(mine, ranks);
  for (int i = 0; i < g.size(); ++i) EXPECT_EQ(ranks.data<int32_t>()[i], i);
}

TEST(MpiGroup, AllReduceEveryDtypeAndOp) {
  const Group& g = test_world();
  check_all_reduce<float>(g);
  check_all_reduce<double>(g);
  check_all_reduce<int32_t>(g);
  check_all_reduce<int64_t>(g);
  check_all_reduce<uint8_t>(g);
}

TEST(MpiGroup, ReduceScatterGivesRankItsChunk) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  const int64_t m = 3;
  Tensor in = iota_tensor<double>(n * m, 100.0 * r);  // in[j] = 100 r + j
  Tensor out = Tensor::zeros({m}, DType::f64);
  g.reduce_scatter(in, out);
  for (int64_t k = 0; k < m; ++k) EXPECT_EQ(out.data<double>()[k], 100.0 * n * (n - 1) / 2 + double(n * (r * m + k)));
  g.reduce_scatter(in, out, ReduceOp::avg);
  EXPECT_DOUBLE_EQ(out.data<double>()[0], 100.0 * (n - 1) / 2 + double(r * m));
  // Output aliasing the input (chunk 0) is handled by a private copy.
  Tensor again = iota_tensor<double>(n * m, 100.0 * r);
  g.reduce_scatter(again, again.slice(0, {m}));
  EXPECT_EQ(again.data<double>()[1], 100.0 * n * (n - 1) / 2 + double(n * (r * m + 1)));
}

// bf16 sums: MPI has no bf16, so a user operation adds in f32 and rounds each partial sum to
// bf16. Small integers are exact; 1 + n * 2^-9 shows the rounding (2^-9 is half a bf16 step at
// 1, so partial sums round back to 1 or up to 1 + 2^-7, depending on the tree: bounded by
// n - 1 roundings of half a step each); max is refused.
TEST(MpiGroup, Bf16SumsRoundEachPartialSumAndMaxIsRefused) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  const int64_t m = 6;
  Tensor t = Tensor::empty({m}, DType::bf16);
  auto* p = t.data<bf16_t>();
  for (int64_t i = 0; i < m; ++i) p[i] = f32_to_bf16(float(r + 1 + i));
  g.all_reduce(t);
  for (int64_t i = 0; i < m; ++i) EXPECT_EQ(bf16_to_f32(p[i]), float(n * (n + 1) / 2 + n * i)) << i;
  g.all_reduce(t, ReduceOp::avg);  // every rank holds the same sums: the average is the sum / n * n / n
  for (int64_t i = 0; i < m; ++i)
    EXPECT_EQ(bf16_to_f32(p[i]), bf16_to_f32(f32_to_bf16(float(n * (n + 1) / 2 + n * i)))) << i;
  Tensor u = Tensor::empty({1}, DType::bf16);
  u.data<bf16_t>()[0] = f32_to_bf16(r == 0 ? 1.0f : std::ldexp(1.0f, -9));
  g.all_reduce(u);
  const double exact = 1.0 + (n - 1) * std::ldexp(1.0, -9), got = bf16_to_f32(u.data<bf16_t>()[0]);
  EXPECT_LE(std::fabs(got - exact), (n - 1) * std::ldexp(1.0, -8)) << "n=" << n;
  Tensor in = Tensor::empty({n * 2}, DType::bf16), out = Tensor::empty({2}, DType::bf16);
  for (int64_t j = 0; j < 2 * n; ++j) in.data<bf16_t>()[j] = f32_to_bf16(float(j + r));
  g.reduce_scatter(in, out);
  for (int64_t k = 0; k < 2; ++k)
    EXPECT_EQ(bf16_to_f32(out.data<bf16_t>()[k]), float(n * (2 * r + k) + n * (n - 1) / 2)) << k;
  std::string e;
  try {
    g.all_reduce(t, ReduceOp::max);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("bf16 reductions are sum and avg, not max"), std::string::npos) << e;
}

// f16 (pipeline activations and ZeRO weight gathers under fp16) moves as bits: all-gather and
// send/recv carry every pattern, NaNs and infinities included; reductions are refused on every
// rank before anything is sent.
TEST(MpiGroup, F16MovesBitExactAndIsNotReduced) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  const int64_t m = 5;
  Tensor in = Tensor::empty({m}, DType::f16), out = Tensor::empty({n * m}, DType::f16);
  auto bits = [](int rank, int64_t i) { return uint16_t(0x7c00u + uint32_t(rank) * 977u + uint32_t(i) * 4099u); };
  for (int64_t i = 0; i < m; ++i) in.data<f16_t>()[i].bits = bits(r, i);
  g.all_gather(in, out);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(out.data<f16_t>()[q * m + i].bits, bits(q, i)) << q << " " << i;
  if (n >= 2 && r < 2) {
    Tensor got = Tensor::empty({m}, DType::f16);
    if (r == 0) g.send(in, 1);
    if (r == 1) {
      g.recv(got, 0);
      for (int64_t i = 0; i < m; ++i) EXPECT_EQ(got.data<f16_t>()[i].bits, bits(0, i)) << i;
    }
  }
  std::string e;
  try {
    g.all_reduce(in);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("tensor is f16, which host backends move"), std::string::npos) << e;
}

TEST(MpiGroup, AllGatherOutOfPlaceAndInPlace) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  const int64_t m = 4;
  Tensor in = iota_tensor<int64_t>(m, 10.0 * r);
  Tensor out = Tensor::zeros({n * m}, DType::i64);
  g.all_gather(in, out);
  for (int q = 0; q < n; ++q)
    for (int64_t k = 0; k < m; ++k) EXPECT_EQ(out.data<int64_t>()[q * m + k], 10 * q + k);

  Tensor buf = Tensor::zeros({n * m}, DType::f32);
  Tensor mine = buf.slice(r * m, {m});
  mine.fill(float(r) + 0.5f);
  g.all_gather(mine, buf);  // ZeRO-style: each rank's shard is already in place
  for (int q = 0; q < n; ++q) EXPECT_EQ(buf.data<float>()[q * m + m - 1], float(q) + 0.5f);
}

TEST(MpiGroup, BroadcastFromLastRank) {
  const Group& g = test_world();
  const int root = g.size() - 1;
  Tensor t = g.rank() == root ? iota_tensor<float>(1000, 42) : Tensor::zeros({1000}, DType::f32);
  g.broadcast(t, root);
  EXPECT_EQ(t.data<float>()[0], 42.0f);
  EXPECT_EQ(t.data<float>()[999], 1041.0f);
}

TEST(MpiGroup, SendRecvRingDoesNotDeadlock) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  // Large enough for the rendezvous protocol: every rank sends before anyone receives.
  const int64_t m = 1 << 20;
  Tensor out = iota_tensor<float>(m, r);
  Tensor in = Tensor::zeros({m}, DType::f32);
  Tensor small_out = Tensor::from_vector<int32_t>({r * 7}, {1});
  Tensor small_in = Tensor::zeros({1}, DType::i32);
  Work s1 = g.send_async(out, right, 1);
  Work s2 = g.send_async(small_out, right, 2);
  Work r2 = g.recv_async(small_in, left, 2);  // tags match out of posting order
  Work r1 = g.recv_async(in, left, 1);
  r1.wait();
  r2.wait();
  s1.wait();
  s2.wait();
  EXPECT_EQ(in.data<float>()[0], float(left));
  EXPECT_EQ(in.data<float>()[m - 1], float(left + m - 1));
  EXPECT_EQ(small_in.data<int32_t>()[0], left * 7);
}

TEST(MpiGroup, AllToAllEqualChunks) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  const int64_t m = 3;
  std::vector<int32_t> v;
  for (int j = 0; j < n; ++j)
    for (int64_t k = 0; k < m; ++k) v.push_back(int32_t(r * 1000 + j * 10 + k));
  Tensor in = Tensor::from_vector(v, {n * m});
  Tensor out = Tensor::zeros({n * m}, DType::i32);
  g.all_to_all(in, out);
  for (int i = 0; i < n; ++i)
    for (int64_t k = 0; k < m; ++k) EXPECT_EQ(out.data<int32_t>()[i * m + k], i * 1000 + r * 10 + k);
}

TEST(MpiGroup, AllToAllVUnevenCounts) {
  const Group& g = test_world();
  const int n = g.size(), r = g.rank();
  auto count = [](int from, int to) { return int64_t((from + 2 * to) % 3); };  // 0, 1 or 2
  std::vector<int64_t> sc, rc;
  std::vector<float> v;
  for (int j = 0; j < n; ++j) {
    sc.push_back(count(r, j));
    rc.push_back(count(j, r));
    for (int64_t k = 0; k < count(r, j); ++k) v.push_back(float(r * 100 + j * 10 + k));
  }
  v.push_back(-1);  // slack beyond the counted elements is allowed and ignored
  Tensor in = Tensor::from_vector(v, {int64_t(v.size())});
  int64_t total = 0;
  for (int64_t c : rc) total += c;
  Tensor out = Tensor::empty({total + 1}, DType::f32);
  out.fill(-7);
  g.all_to_all_v(in, sc, out, rc);
  int64_t at = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t k = 0; k < rc[size_t(i)]; ++k, ++at)
      EXPECT_EQ(out.data<float>()[at], float(i * 100 + r * 10 + k)) << "from rank " << i;
  EXPECT_EQ(out.data<float>()[total], -7.0f);  // untouched
}
