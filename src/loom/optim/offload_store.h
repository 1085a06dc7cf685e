// Where offloaded training state lives (parallel.offload): a host pool (MemCategory::offloaded)
// or a file in a directory, addressed in floats, with a blocking copy in either direction; and the
// I/O thread that runs those copies in order. The Adam moments' staging (optim/moment_offload.h)
// and ZeRO-3's parameter shards (parallel/shard_offload.h) each keep one of both.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "loom/core/tensor.h"
#include "loom/optim/offload_target.h"

namespace loom::optim {

class OffloadStore {
 public:
  // `elems` floats, zero at first. host: a pool; disk: a sparse file `stem`.<pid>.<n>.bin under
  // `dir` (created if missing; removed with this object). `what` names the state in messages
  // ("the optimizer's moments"); `key` the configuration key that chose the target.
  OffloadStore(OffloadTarget target, const std::string& dir, int64_t elems, const std::string& what,
               const std::string& stem, const std::string& key);
  ~OffloadStore();
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  // n floats between `buf` and [offset, offset + n): written there, or read from there.
  void copy(bool write, int64_t offset, int64_t n, float* buf);
  int64_t elems() const { return elems_; }

 private:
  OffloadTarget target_;
  int64_t elems_;
  std::string what_, path_;
  int fd_ = -1;
  Tensor pool_;  // host
};

// One thread running copies in the order they were posted: each job's `copy` outside the lock,
// then its `done` under it. The owner keeps the state its jobs and waits share under mutex().
class OffloadQueue {
 public:
  OffloadQueue();
  ~OffloadQueue();  // after every posted job
  OffloadQueue(const OffloadQueue&) = delete;
  OffloadQueue& operator=(const OffloadQueue&) = delete;

  // Not with the lock held.
  void post(std::function<void()> copy, std::function<void()> done = {});
  // With `lock` (of mutex()) held: waits until ready() or a copy failed, which it throws (every
  // later wait throws it again).
  void wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready);
  // Every posted job done (not with the lock held).
  void flush();
  std::mutex& mutex() { return mu_; }

 private:
  struct Job {
    std::function<void()> copy, done;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  int64_t posted_ = 0, finished_ = 0;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::optim
