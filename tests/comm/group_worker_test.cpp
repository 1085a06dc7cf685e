// comm::Group's worker thread with a scripted two-rank transport: which thread posts a transfer
// and which completes it (Backend::posts_from_any_thread), and that a transfer still waits behind
// an operation issued before it.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "loom/comm/backend.h"

using namespace loom;
using namespace loom::comm;

namespace {

using Clock = std::chrono::steady_clock;

// What the test tells the transport and what the transport saw.
struct Script {
  std::mutex mu;
  std::condition_variable cv;
  bool any_thread = true;     // posts_from_any_thread()
  int posts = 0;              // post_send/post_recv calls
  std::thread::id posted_on;  // the last one's thread
  bool in_barrier = false, barrier_open = false;
  // A transfer reports completion to a test() on `deliver_to`, or to any thread after `deadline`.
  std::thread::id deliver_to;
  Clock::time_point deadline;
  std::thread::id completed_on;  // the thread whose test() first saw it complete
};

class ScriptedTransfer final : public PendingTransfer {
 public:
  explicit ScriptedTransfer(std::shared_ptr<Script> s) : s_(std::move(s)) {}
  bool test() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (std::this_thread::get_id() != s_->deliver_to && Clock::now() < s_->deadline) return false;
    if (s_->completed_on == std::thread::id()) s_->completed_on = std::this_thread::get_id();
    return true;
  }

 private:
  std::shared_ptr<Script> s_;
};

class ScriptedBackend final : public Backend {
 public:
  explicit ScriptedBackend(std::shared_ptr<Script> s) : s_(std::move(s)) {}
  const char* name() const override { return "scripted"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Device device() const override { return Device::cpu; }
  bool supports(DType t) const override { return t == DType::f32; }
  void all_reduce(const Tensor&, ReduceOp) override {}
  void reduce_scatter(const Tensor&, const Tensor&, ReduceOp) override {}
  void all_gather(const Tensor&, const Tensor&) override {}
  void broadcast(const Tensor&, int) override {}
  void all_to_all(const Tensor&, const Tensor&) override {}
  void all_to_all_v(const Tensor&, const std::vector<int64_t>&, const Tensor&, const std::vector<int64_t>&) override {}
  // Blocks until the test opens it: the worker is busy meanwhile.
  void barrier() override {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->in_barrier = true;
    s_->cv.notify_all();
    s_->cv.wait(lock, [&] { return s_->barrier_open; });
  }
  std::unique_ptr<PendingTransfer> post_send(const Tensor&, int, int) override { return post(); }
  std::unique_ptr<PendingTransfer> post_recv(const Tensor&, int, int) override { return post(); }
  bool posts_from_any_thread() const override { return s_->any_thread; }
  std::unique_ptr<Backend> split(int, int) override { return nullptr; }

 private:
  std::unique_ptr<PendingTransfer> post() {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->posts;
    s_->posted_on = std::this_thread::get_id();
    return std::make_unique<ScriptedTransfer>(s_);
  }
  std::shared_ptr<Script> s_;
};

Group scripted_group(const std::shared_ptr<Script>& s) {
  return make_group(std::make_unique<ScriptedBackend>(s), "scripted", std::make_shared<CommRecord>());
}

}  // namespace

TEST(GroupWorker, ATransferIsPostedAndCompletedByTheThreadThatNeedsIt) {
  auto s = std::make_shared<Script>();
  s->deliver_to = std::this_thread::get_id();
  // The worker's polls see the transfer complete only after this; the wait must not need them.
  s->deadline = Clock::now() + std::chrono::seconds(20);
  Group g = scripted_group(s);
  Tensor t = Tensor::zeros({4}, DType::f32);
  Work w = g.recv_async(t, 1, 3);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    EXPECT_EQ(s->posts, 1) << "posted before recv_async returned";
    EXPECT_EQ(s->posted_on, std::this_thread::get_id());
  }
  const auto start = Clock::now();
  w.wait();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "the wait sat out the worker's deadline";
  std::lock_guard<std::mutex> lock(s->mu);
  EXPECT_EQ(s->completed_on, std::this_thread::get_id());
}

TEST(GroupWorker, ATransportBoundToOneThreadPostsOnTheWorker) {
  auto s = std::make_shared<Script>();
  s->any_thread = false;
  s->deadline = Clock::now();  // complete at the first test(), on whichever thread asks
  Group g = scripted_group(s);
  Tensor t = Tensor::zeros({4}, DType::f32);
  g.send_async(t, 1, 0).wait();
  std::lock_guard<std::mutex> lock(s->mu);
  EXPECT_EQ(s->posts, 1);
  EXPECT_NE(s->posted_on, std::this_thread::get_id());
  EXPECT_NE(s->completed_on, std::this_thread::get_id()) << "the worker alone may test such a transfer";
}

TEST(GroupWorker, ATransferWaitsBehindAnOperationIssuedBeforeIt) {
  auto s = std::make_shared<Script>();
  s->deadline = Clock::now();
  Group g = scripted_group(s);
  Work barrier = g.barrier_async();
  {
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->in_barrier; });
  }
  Tensor t = Tensor::zeros({4}, DType::f32);
  Work send = g.send_async(t, 1, 0);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    EXPECT_EQ(s->posts, 0) << "posted while the barrier issued before it still ran";
    s->barrier_open = true;
  }
  s->cv.notify_all();
  barrier.wait();
  send.wait();
  std::lock_guard<std::mutex> lock(s->mu);
  EXPECT_EQ(s->posts, 1);
  EXPECT_NE(s->posted_on, std::this_thread::get_id());
}
