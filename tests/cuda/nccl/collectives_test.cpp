// The NCCL backend's collectives on CUDA tensors against their arithmetic on rank-dependent
// data, for any number of ranks (one per GPU): every dtype and reduction, sizes from 1 element
// to past NCCL's chunking, in-place all-gather, every broadcast root, uneven all_to_all_v, async
// overlap, split, send/recv pairs with two ranks or more, ordering after kernels still running,
// and the errors for host tensors. A group of one still runs every NCCL call but verifies no
// reduction (every op returns its one input; main.cpp says so): that takes 2 GPUs or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/nccl/nccl_world.h"
#include "loom/comm/nccl.h"
#include "loom/comm/record.h"
#include "loom/kernels/ops.h"
#include "testing/errors.h"

using namespace loom;
using namespace loom::comm;
using loom::testing::device_vector;
using loom::testing::error_of;
using loom::testing::host_values;
using loom::testing::to_host;

namespace {

// Small integers, exact in every dtype (bf16 holds integers to 256) for sums of up to 85 ranks.
double reduce_input(int rank, int64_t i) { return 1 + (rank + i) % 3; }
// Distinct per rank and element, exact in every dtype for up to 36 ranks.
double gather_input(int rank, int64_t i) { return rank * 7 + i % 5; }

std::vector<double> values(int64_t n, int rank, double (*f)(int, int64_t)) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = f(rank, i);
  return v;
}

// Unit roundoff of a float dtype's sum; NCCL's avg scales each input by 1/n before summing.
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, bf16_t>)
    return 0x1p-8;
  else if constexpr (std::is_same_v<T, f16_t>)
    return 0x1p-11;
  else if constexpr (std::is_same_v<T, float>)
    return 0x1p-24;
  else if constexpr (std::is_same_v<T, double>)
    return 0x1p-53;
  else
    return 0;
}

double reduce_expected(ReduceOp op, int n, int64_t i, bool integer) {
  double sum = 0, mx = -1e300, mn = 1e300;
  for (int r = 0; r < n; ++r) {
    const double v = reduce_input(r, i);
    sum += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  switch (op) {
    case ReduceOp::sum: return sum;
    case ReduceOp::max: return mx;
    case ReduceOp::min: return mn;
    case ReduceOp::avg: return integer ? std::floor(sum / n) : sum / n;
  }
  return 0;
}

template <class T>
void check_all_reduce(const Group& g, int64_t m) {
  const bool integer = std::is_integral_v<T>;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
    SCOPED_TRACE(std::string(dtype_name(dtype_of<T>())) + "[" + std::to_string(m) + "] " + reduce_op_name(op));
    Tensor t = device_vector<T>(values(m, g.rank(), reduce_input));
    g.all_reduce(t, op);
    const std::vector<double> got = host_values<T>(t);
    int bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      const double want = reduce_expected(op, g.size(), i, integer);
      // avg of floats rounds (1/n, the scaled inputs, the sum); the rest is exact.
      const double tol = op == ReduceOp::avg ? (g.size() + 2) * 2 * unit_roundoff<T>() * want : 0;
      if (!(std::abs(got[size_t(i)] - want) <= tol) && bad++ < 3)
        ADD_FAILURE() << "element " << i << ": " << got[size_t(i)] << ", want " << want;
    }
  }
}

}  // namespace

TEST_F(NcclTest, GroupSpansTheWorld) {
  EXPECT_STREQ(g().backend_name(), "nccl");
  EXPECT_EQ(g().name(), "nccl");
  EXPECT_GE(g().size(), 1);
  EXPECT_EQ(nccl_describe().rfind("nccl ", 0), 0u) << nccl_describe();
  EXPECT_TRUE(nccl_available());
  Tensor ranks = device_vector<int32_t>(std::vector<double>(size_t(g().size()), -1));
  g().all_gather(device_vector<int32_t>({double(g().rank())}), ranks);
  const std::vector<double> got = host_values<int32_t>(ranks);
  for (int r = 0; r < g().size(); ++r) EXPECT_EQ(got[size_t(r)], r);
}

TEST_F(NcclTest, AllReduceEveryDtypeAndOp) {
  for (int64_t m : {int64_t(1), int64_t(5), int64_t(4099)}) {
    check_all_reduce<float>(g(), m);
    check_all_reduce<double>(g(), m);
    check_all_reduce<bf16_t>(g(), m);
    check_all_reduce<f16_t>(g(), m);
    check_all_reduce<int32_t>(g(), m);
    check_all_reduce<int64_t>(g(), m);
    check_all_reduce<int8_t>(g(), m);
    check_all_reduce<uint8_t>(g(), m);
  }
}

// Past NCCL's internal chunking and channels: 64 MiB of f32.
TEST_F(NcclTest, AllReduceLarge) {
  const int64_t m = (int64_t(16) << 20) + 3;
  Tensor t = device_vector<float>(values(m, g().rank(), reduce_input));
  g().all_reduce(t);
  const std::vector<double> got = host_values<float>(t);
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    if (got[size_t(i)] != reduce_expected(ReduceOp::sum, g().size(), i, false) && bad++ < 3)
      ADD_FAILURE() << "element " << i << ": " << got[size_t(i)];
}

TEST_F(NcclTest, ReduceScatter) {
  const int n = g().size(), r = g().rank();
  for (int64_t m : {int64_t(1), int64_t(7), int64_t(4099)})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      SCOPED_TRACE(std::to_string(m) + " per rank, " + reduce_op_name(op));
      Tensor in = device_vector<float>(values(n * m, r, reduce_input));
      Tensor out = device_vector<float>(std::vector<double>(size_t(m), -1));
      g().reduce_scatter(in, out, op);
      const std::vector<double> got = host_values<float>(out);
      for (int64_t i = 0; i < m; ++i)
        ASSERT_EQ(got[size_t(i)], reduce_expected(op, n, r * m + i, false)) << "element " << i;
      Tensor in16 = device_vector<bf16_t>(values(n * m, r, reduce_input));
      Tensor out16 = device_vector<bf16_t>(std::vector<double>(size_t(m), -1));
      g().reduce_scatter(in16, out16, op);
      const std::vector<double> got16 = host_values<bf16_t>(out16);
      for (int64_t i = 0; i < m; ++i)
        ASSERT_EQ(got16[size_t(i)], reduce_expected(op, n, r * m + i, false)) << "bf16 element " << i;
    }
}

TEST_F(NcclTest, AllGatherAndInPlace) {
  const int n = g().size(), r = g().rank();
  for (int64_t m : {int64_t(1), int64_t(5), int64_t(4099)}) {
    SCOPED_TRACE(std::to_string(m) + " per rank");
    std::vector<double> want;
    for (int s = 0; s < n; ++s)
      for (int64_t i = 0; i < m; ++i) want.push_back(gather_input(s, i));
    Tensor out = device_vector<int64_t>(std::vector<double>(size_t(n * m), -1));
    g().all_gather(device_vector<int64_t>(values(m, r, gather_input)), out);
    EXPECT_EQ(host_values<int64_t>(out), want);
    Tensor out16 = device_vector<bf16_t>(std::vector<double>(size_t(n * m), -1));
    g().all_gather(device_vector<bf16_t>(values(m, r, gather_input)), out16);
    EXPECT_EQ(host_values<bf16_t>(out16), want);
    // In place: this rank's input is its own chunk of the output.
    std::vector<double> mine(size_t(n * m), -1);
    for (int64_t i = 0; i < m; ++i) mine[size_t(r * m + i)] = gather_input(r, i);
    Tensor shared = device_vector<float>(mine);
    g().all_gather(shared.slice(r * m, {m}), shared);
    EXPECT_EQ(host_values<float>(shared), want);
  }
}

TEST_F(NcclTest, BroadcastFromEveryRoot) {
  const int n = g().size(), r = g().rank();
  for (int root = 0; root < n; ++root)
    for (int64_t m : {int64_t(1), int64_t(4099), int64_t(1) << 20}) {
      SCOPED_TRACE("root " + std::to_string(root) + ", " + std::to_string(m) + " elements");
      const std::vector<double> want = values(m, root, gather_input);
      Tensor t = device_vector<float>(r == root ? want : std::vector<double>(size_t(m), -1));
      g().broadcast(t, root);
      EXPECT_EQ(host_values<float>(t), want);
      Tensor u = device_vector<uint8_t>(r == root ? want : std::vector<double>(size_t(m), 255));
      g().broadcast(u, root);
      EXPECT_EQ(host_values<uint8_t>(u), want);
    }
}

TEST_F(NcclTest, AllToAll) {
  const int n = g().size(), r = g().rank();
  const int64_t m = 3;
  std::vector<double> in, want;
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < m; ++i) {
      in.push_back(r * 100 + p * 10 + i);    // chunk p goes to rank p
      want.push_back(p * 100 + r * 10 + i);  // chunk p came from rank p
    }
  Tensor out = device_vector<float>(std::vector<double>(size_t(n * m), -1));
  g().all_to_all(device_vector<float>(in), out);
  EXPECT_EQ(host_values<float>(out), want);
}

// Uneven counts (rank r sends 1 + (r + p) % 3 elements to p, so p expects as many from r),
// and outputs longer than the counts keep their tail.
TEST_F(NcclTest, AllToAllVUnevenCounts) {
  const int n = g().size(), r = g().rank();
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<double> in, want;
  for (int p = 0; p < n; ++p) {
    send_counts.push_back(1 + (r + p) % 3);
    recv_counts.push_back(1 + (p + r) % 3);
    for (int64_t k = 0; k < send_counts.back(); ++k) in.push_back(r * 100 + p * 10 + k);
    for (int64_t k = 0; k < recv_counts.back(); ++k) want.push_back(p * 100 + r * 10 + k);
  }
  want.push_back(-7);
  want.push_back(-7);
  Tensor out = device_vector<int32_t>(std::vector<double>(want.size(), -7));
  g().all_to_all_v(device_vector<int32_t>(in), send_counts, out, recv_counts);
  EXPECT_EQ(host_values<int32_t>(out), want);
}

// Several operations in flight on the group's stream complete in issue order with their own
// results; the shared record holds them under the group's name.
TEST_F(NcclTest, AsyncOperationsOverlapAndAreRecorded) {
  const int n = g().size();
  const uint64_t started = g().record().total_started();
  std::vector<Tensor> ts;
  std::vector<Work> works;
  for (int k = 0; k < 6; ++k) {
    ts.push_back(device_vector<float>(std::vector<double>(size_t(1000 + k), double(k + 1))));
    works.push_back(g().all_reduce_async(ts.back()));
  }
  works.push_back(g().barrier_async());
  for (const Work& w : works) w.wait();
  for (int k = 0; k < 6; ++k) {
    const std::vector<double> got = host_values<float>(ts[size_t(k)]);
    EXPECT_EQ(got.size(), size_t(1000 + k));
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [&](double v) { return v == double(n * (k + 1)); }))
        << "tensor " << k << " element 0: " << got[0];
  }
  EXPECT_GE(g().record().total_started(), started + 7);
  std::optional<CommEvent> last = g().record().last_completed("nccl");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->op, "barrier");
}

TEST_F(NcclTest, SplitByParity) {
  const int n = g().size(), r = g().rank();
  Group half = g().split(r % 2, r);
  ASSERT_TRUE(half.valid());
  EXPECT_STREQ(half.backend_name(), "nccl");
  EXPECT_EQ(half.size(), (n + 1 - r % 2) / 2);
  EXPECT_EQ(half.rank(), r / 2);
  Tensor t = device_vector<float>({double(r), 1});
  half.all_reduce(t);
  double rank_sum = 0;
  for (int s = r % 2; s < n; s += 2) rank_sum += s;
  EXPECT_EQ(host_values<float>(t), (std::vector<double>{rank_sum, double(half.size())}));
  EXPECT_FALSE(g().split(-1, r).valid());
}

// Pairs (0, 1), (2, 3), ...: the even rank sends first, the odd one receives first (each
// send/recv is its own NCCL group; see nccl_backend.cpp). With one rank there is no peer:
// sending to itself is refused.
TEST_F(NcclTest, SendRecvPairs) {
  const int n = g().size(), r = g().rank();
  Tensor mine = device_vector<float>(values(4097, r, gather_input));
  if (n == 1) {
    std::string e = error_of([&] { g().send(mine, 0); });
    EXPECT_NE(e.find("is this rank"), std::string::npos) << e;
    return;
  }
  const int peer = r % 2 == 0 ? r + 1 : r - 1;
  if (peer >= n) return;  // the odd one out of an odd number of ranks
  Tensor theirs = device_vector<float>(std::vector<double>(4097, -1));
  if (r % 2 == 0) {
    g().send(mine, peer, 3);
    g().recv(theirs, peer, 3);
  } else {
    g().recv(theirs, peer, 3);
    g().send(mine, peer, 3);
  }
  EXPECT_EQ(host_values<float>(theirs), values(4097, peer, gather_input));
}

// Kernels are asynchronous: a collective issued right after them must wait for them to
// finish before it reads its input. 41 dependent GELU launches over 64 MiB keep the default
// stream busy well past the moment the group's worker enqueues the all-gather, so an input
// read too early shows as the -1 it was filled with, or a partial result.
TEST_F(NcclTest, CollectivesWaitForKernelsIssuedBeforeThem) {
  const int n = g().size(), r = g().rank();
  const int64_t m = int64_t(1) << 24;
  Tensor x = device_vector<float>(std::vector<double>(size_t(m), 2.0 + r));
  Tensor in = device_vector<float>(std::vector<double>(size_t(m), -1));
  Tensor tmp = Tensor::empty({m}, DType::f32, MemCategory::activations, cuda::allocator());
  ops::gelu_forward(x, in);
  for (int k = 0; k < 20; ++k) {
    ops::gelu_forward(in, tmp);
    ops::gelu_forward(tmp, in);
  }
  Tensor out = Tensor::empty({n * m}, DType::f32, MemCategory::activations, cuda::allocator());
  g().all_gather(in, out);
  const Tensor final_in = to_host(in);  // the default stream's copy waits for the kernels
  const Tensor gathered = to_host(out);
  const float mine = final_in.data<float>()[0];
  EXPECT_GT(mine, 0.0f);
  EXPECT_LT(mine, 2.0f + float(r));
  EXPECT_EQ(std::memcmp(gathered.data<float>() + r * m, final_in.data<float>(), size_t(m) * 4), 0)
      << "the all-gather read its input before the GELU kernels issued before it had finished; element 0 was "
      << gathered.data<float>()[r * m] << ", want " << mine;
}

TEST_F(NcclTest, RefusesHostTensors) {
  std::string e = error_of([&] { g().all_reduce(Tensor::zeros({4}, DType::f32)); });
  EXPECT_NE(e.find("is on cpu but group 'nccl' uses the nccl backend, which takes cuda tensors"), std::string::npos)
      << e;
}
