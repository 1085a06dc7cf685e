// Under mpiexec: async Work that completes while the caller computes, split groups (a 2x2
// grid when run with 4 ranks), consistent sequence numbers, traces, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "comm/mpi/mpi_world.h"
#include "loom/comm/record.h"
#include "loom/core/timer.h"
#include "loom/core/trace.h"

using namespace loom;
using namespace loom::comm;

TEST(MpiAsync, WorkCompletesWhileTheCallerComputes) {
  const Group& g = test_world();
  const int64_t m = 1 << 22;  // 16 MiB of f32
  Tensor t = Tensor::empty({m}, DType::f32);
  t.fill(1.0);
  g.barrier();
  Work w = g.all_reduce_async(t);
  // Compute without calling into MPI: only the group's worker can move the data.
  double acc = 0;
  int64_t iters = 0;
  Stopwatch sw;
  bool done = false;
  while (!done && sw.seconds() < 30) {
    for (int i = 0; i < 20000; ++i) acc += std::sqrt(double(i + iters));
    ++iters;
    done = w.test();
  }
  EXPECT_TRUE(done) << "all_reduce did not progress without wait()";
  EXPECT_GT(acc, 0);
  w.wait();
  EXPECT_EQ(t.data<float>()[0], float(g.size()));
  EXPECT_EQ(t.data<float>()[m - 1], float(g.size()));
}

TEST(MpiAsync, ManyOutstandingOpsWaitedInReverse) {
  const Group& g = test_world();
  std::vector<Tensor> ts;
  std::vector<Work> ws;
  for (int i = 0; i < 8; ++i) {
    ts.push_back(Tensor::from_vector<int64_t>({int64_t(i) * g.rank()}, {1}));
    ws.push_back(g.all_reduce_async(ts.back(), ReduceOp::max));
  }
  for (int i = 7; i >= 0; --i) ws[size_t(i)].wait();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ts[size_t(i)].data<int64_t>()[0], int64_t(i) * (g.size() - 1));
}

TEST(MpiSplit, EvenOddGroupsOrderedByKey) {
  const Group& g = test_world();
  const int r = g.rank(), n = g.size();
  Group parity = g.split(r % 2, -r, r % 2 ? "odd" : "even");  // key -r: reversed order
  ASSERT_TRUE(parity.valid());
  int members = (n + 1 - r % 2) / 2;
  EXPECT_EQ(parity.size(), members);
  EXPECT_EQ(parity.rank(), members - 1 - r / 2);
  Tensor t = Tensor::from_vector<int32_t>({r}, {1});
  parity.all_reduce(t);
  int want = 0;
  for (int q = r % 2; q < n; q += 2) want += q;
  EXPECT_EQ(t.data<int32_t>()[0], want);

  Group none = g.split(r == 0 ? -1 : 0, r);
  EXPECT_EQ(none.valid(), r != 0);
  if (none.valid()) {
    EXPECT_EQ(none.size(), n - 1);
  }
}

TEST(MpiSplit, TwoByTwoGridRowsAndColumns) {
  const Group& g = test_world();
  if (g.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = g.rank();
  Group row = g.split(r / 2, r % 2, "row");
  Group col = g.split(r % 2, r / 2, "col");
  EXPECT_EQ(row.size(), 2);
  EXPECT_EQ(col.size(), 2);
  EXPECT_EQ(row.rank(), r % 2);
  EXPECT_EQ(col.rank(), r / 2);
  // Row and column collectives in flight at once, on different worker threads.
  Tensor a = Tensor::from_vector<float>({float(r)}, {1});
  Tensor b = Tensor::from_vector<float>({float(r)}, {1});
  Work wa = row.all_reduce_async(a);
  Work wb = col.all_reduce_async(b);
  wa.wait();
  wb.wait();
  EXPECT_EQ(a.data<float>()[0], r < 2 ? 1.0f : 5.0f);  // {0,1} and {2,3}
  EXPECT_EQ(b.data<float>()[0], r % 2 ? 4.0f : 2.0f);  // {0,2} and {1,3}
  Tensor gathered = Tensor::zeros({2}, DType::f32);
  col.all_gather(Tensor::from_vector<float>({float(r)}, {1}), gathered);
  EXPECT_EQ(gathered.data<float>()[0], float(r % 2));
  EXPECT_EQ(gathered.data<float>()[1], float(r % 2 + 2));
}

TEST(MpiRecord, SequenceNumbersAgreeAcrossRanksAndTraceShowsThem) {
  const Group& g = test_world();
  Group sub = g.split(0, g.rank(), "sub");
  for (int i = 0; i < 3; ++i) sub.barrier();
  trace::start();
  sub.all_reduce(Tensor::zeros({16}, DType::f32));
  trace::stop();
  auto last = sub.record().last_completed("sub");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->op, "all_reduce");
  Tensor seqs = Tensor::zeros({g.size()}, DType::i64);
  g.all_gather(Tensor::from_vector<int64_t>({int64_t(last->seq)}, {1}), seqs);
  for (int i = 0; i < g.size(); ++i) EXPECT_EQ(seqs.data<int64_t>()[i], 4);
  std::ostringstream os;
  trace::write_json(os, {g.rank(), g.size(), "test"});
  EXPECT_NE(os.str().find("\"name\":\"all_reduce\",\"cat\":\"comm\",\"pid\":" + std::to_string(g.rank())),
            std::string::npos)
      << os.str();
  EXPECT_NE(os.str().find("\"args\":{\"bytes\":64,\"seq\":4,\"ok\":1}"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("\"name\":\"comm sub\""), std::string::npos) << os.str();
}

TEST(MpiErrors, SizeMismatchesNameBothSizes) {
  const Group& g = test_world();
  const int n = g.size();
  Tensor in = Tensor::zeros({n * 3 + 1}, DType::f32), out = Tensor::zeros({3}, DType::f32);
  try {
    g.reduce_scatter(in, out);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string s = e.what();
    EXPECT_NE(
        s.find(str_cat("input has ", n * 3 + 1, " elements but group 'world' has ", n, " ranks and the output 3")),
        std::string::npos)
        << s;
  }
  // A receive whose tensor is larger than the message fails on the receiving rank only.
  if (g.rank() == 0) g.send(Tensor::zeros({3}, DType::f32), 1, 9);
  if (g.rank() == 1) {
    try {
      g.recv(Tensor::zeros({4}, DType::f32), 0, 9);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("recv: rank 0 sent 3 elements but the tensor holds 4"), std::string::npos)
          << e.what();
    }
  }
  g.barrier();
}
