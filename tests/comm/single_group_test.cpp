// comm::Group on one process: collective semantics with a single rank, argument checks
// (messages naming both sizes), Work handles and the operation record. MPI runs are in
// tests/comm/mpi/.
#include <gtest/gtest.h>

#include <string>

#include "loom/comm/group.h"
#include "loom/comm/nccl.h"
#include "loom/comm/record.h"
#include "loom/comm/world.h"

using namespace loom;
using namespace loom::comm;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(SingleGroup, CollectivesAreIdentityOrCopies) {
  Group g = Group::single("solo");
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.name(), "solo");
  EXPECT_STREQ(g.backend_name(), "single");

  Tensor t = Tensor::from_vector<float>({1, 2, 3}, {3});
  g.all_reduce(t, ReduceOp::avg);
  EXPECT_EQ(t.to_f32_vector(), (std::vector<float>{1, 2, 3}));

  Tensor out = Tensor::zeros({3}, DType::f32);
  g.reduce_scatter(t, out);
  EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{1, 2, 3}));

  Tensor in_i = Tensor::from_vector<int64_t>({7, 8}, {2});
  Tensor out_i = Tensor::zeros({2}, DType::i64);
  g.all_gather(in_i, out_i);
  EXPECT_EQ(out_i.data<int64_t>()[1], 8);

  Tensor a = Tensor::from_vector<int32_t>({5, 6, 7}, {3});
  Tensor b = Tensor::zeros({3}, DType::i32);
  g.all_to_all_v(a, {2}, b, {2});
  EXPECT_EQ(b.data<int32_t>()[0], 5);
  EXPECT_EQ(b.data<int32_t>()[1], 6);
  EXPECT_EQ(b.data<int32_t>()[2], 0);  // beyond recv_counts: untouched
  g.barrier();
  g.broadcast(t, 0);

  Group sub = g.split(3, 0);
  ASSERT_TRUE(sub.valid());
  EXPECT_EQ(sub.name(), "solo.3");
  EXPECT_FALSE(g.split(-1, 0).valid());
}

TEST(SingleGroup, BadInputNamesTheSizes) {
  Group g = Group::single("solo");
  Tensor in = Tensor::zeros({10}, DType::f32), out = Tensor::zeros({3}, DType::f32);
  std::string e = error_of([&] { g.reduce_scatter(in, out); });
  EXPECT_TRUE(contains(e, "[comm] reduce_scatter: input has 10 elements")) << e;
  EXPECT_TRUE(contains(e, "output 3")) << e;

  e = error_of([&] { g.all_gather(out, in); });
  EXPECT_TRUE(contains(e, "all_gather: output has 10 elements")) << e;
  EXPECT_TRUE(contains(e, "input 3")) << e;

  e = error_of([&] { g.all_to_all(in, out); });
  EXPECT_TRUE(contains(e, "input has 10 elements but output has 3")) << e;

  e = error_of([&] { g.all_gather(in, Tensor::zeros({10}, DType::f64)); });
  EXPECT_TRUE(contains(e, "input is f32 but output is f64")) << e;

  e = error_of([&] { g.all_to_all_v(in, {1, 2}, out, {1}); });
  EXPECT_TRUE(contains(e, "send_counts has 2 entries but group 'solo' has 1 ranks")) << e;
  e = error_of([&] { g.all_to_all_v(in, {4}, out, {4}); });
  EXPECT_TRUE(contains(e, "recv_counts sum to 4 elements but the output has only 3")) << e;

  e = error_of([&] { g.broadcast(in, 1); });
  EXPECT_TRUE(contains(e, "broadcast: root 1 is not a rank of group 'solo'")) << e;
  e = error_of([&] { g.send(in, 0); });
  EXPECT_TRUE(contains(e, "send: dst 0 is this rank")) << e;

  e = error_of([&] { g.all_reduce(Tensor::zeros({2}, DType::i8)); });
  EXPECT_TRUE(contains(e, "tensor is i8")) << e;
  EXPECT_TRUE(contains(e, "f32, f64, bf16 (sum and avg), f16 (moved, not reduced), i32, i64, u8")) << e;
  e = error_of([&] { g.all_reduce(Tensor::zeros({2}, DType::f16)); });
  EXPECT_TRUE(contains(e, "all_reduce: tensor is f16, which host backends move")) << e;
  e = error_of([&] { g.reduce_scatter(Tensor::zeros({2}, DType::f16), Tensor::zeros({2}, DType::f16)); });
  EXPECT_TRUE(contains(e, "reduce_scatter: tensor is f16")) << e;

  e = error_of([&] { g.all_reduce(Tensor()); });
  EXPECT_TRUE(contains(e, "all_reduce: tensor is undefined")) << e;
  e = error_of([&] { Group().all_reduce(in); });
  EXPECT_TRUE(contains(e, "this Group is empty")) << e;
}

TEST(SingleGroup, WorkCompletesAndIsRecordedInIssueOrder) {
  Group g = Group::single("solo");
  Tensor t = Tensor::zeros({1024}, DType::f32);
  std::vector<Work> works;
  for (int i = 0; i < 5; ++i) works.push_back(g.all_reduce_async(t));
  works.push_back(g.barrier_async());
  for (auto& w : works) w.wait();
  for (auto& w : works) EXPECT_TRUE(w.test());
  EXPECT_TRUE(Work().test());

  std::vector<CommEvent> ev = g.record().finished();
  ASSERT_EQ(ev.size(), 6u);
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].seq, i + 1);
    EXPECT_EQ(ev[i].group, "solo");
    EXPECT_EQ(ev[i].state, OpState::completed);
    EXPECT_LE(ev[i].t_start, ev[i].t_end);
  }
  EXPECT_EQ(ev[0].op, "all_reduce");
  EXPECT_EQ(ev[0].bytes, 4096);
  EXPECT_EQ(ev[5].op, "barrier");
  EXPECT_TRUE(g.record().in_flight().empty());
}

TEST(SingleGroup, WorldWithoutLauncherIsOneProcess) {
  WorldOptions o;
  o.backend = WorldBackend::single;
  o.watchdog_timeout_s = 0;
  World w(o);
  EXPECT_FALSE(w.uses_mpi());
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(w.group().name(), "world");
  Tensor t = Tensor::from_vector<double>({2.5}, {1});
  w.group().all_reduce(t, ReduceOp::max);
  EXPECT_EQ(t.data<double>()[0], 2.5);
  EXPECT_EQ(w.record().finished().size(), 1u);
}

TEST(SingleGroup, NcclStubSaysHowToGetIt) {
  if (!contains(nccl_describe(), "built without NCCL")) GTEST_SKIP() << nccl_describe();
  std::string e = error_of([] { nccl_group(Group::single(), 0); });
  EXPECT_TRUE(contains(e, "[comm] this loom was built without NCCL;")) << e;
}
