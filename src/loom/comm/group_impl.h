// Internals of comm::Group: the per-group worker thread that runs operations in issue order
// on the backend, and the Work completion state. Not for use outside src/loom/comm.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/comm/backend.h"

namespace loom::comm {

struct GroupWorker;

struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  // A transfer of a transport that takes calls from any thread: Work::wait polls this worker's
  // transfers itself instead of sleeping until the worker's next poll.
  std::weak_ptr<GroupWorker> poller;
  void complete(std::exception_ptr e);
};

// Queue and backend shared by a GroupImpl and its thread, so the thread can be left
// behind (detached) when the process is failing and a peer will never answer.
struct GroupWorker {
  struct Task {
    std::string op;
    int64_t bytes = 0;
    uint64_t seq = 0;
    std::function<void(Backend&)> run;                               // collectives
    std::function<std::unique_ptr<PendingTransfer>(Backend&)> post;  // send/recv
    std::shared_ptr<WorkState> work;
  };
  struct Posted {
    std::unique_ptr<PendingTransfer> transfer;
    uint64_t record_handle;
    std::string label;
    std::shared_ptr<WorkState> work;
  };

  std::unique_ptr<Backend> backend;
  std::string group_name;
  std::shared_ptr<CommRecord> record;
  std::shared_ptr<ProgressBoard> board;  // null: progress not posted
  ProgressBoard::Lane lane;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  bool running = false;  // the worker has popped a task and is running it outside the lock
  bool stopping = false;
  bool abandon = false;  // drop queued work instead of running it

  // Posted transfers, polled by the worker and, for a transport that takes calls from any
  // thread, by a thread blocked on one of them: the thread that needs the data completes it the
  // moment it arrives, where the worker, which sleeps between polls so as to leave a computing
  // rank's core to its work, may be a scheduler slice late when every core is busy.
  std::mutex poll_mu;
  std::deque<Posted> posted;        // guarded by poll_mu
  std::atomic<size_t> n_posted{0};  // posted.size(), read without the lock

  void loop();
  void run_task(Task& t);
  // Tests the posted transfers and completes those done; false when another thread is at it.
  bool poll();
};

class GroupImpl {
 public:
  GroupImpl(std::unique_ptr<Backend> backend, std::string name, std::shared_ptr<CommRecord> record,
            std::shared_ptr<ProgressBoard> board);
  ~GroupImpl();
  GroupImpl(const GroupImpl&) = delete;
  GroupImpl& operator=(const GroupImpl&) = delete;

  Work submit(const char* op, int64_t bytes, std::function<void(Backend&)> run) const;
  Work submit_transfer(const char* op, int64_t bytes,
                       std::function<std::unique_ptr<PendingTransfer>(Backend&)> post) const;

  int rank, size;
  std::string name;
  std::string backend_name;
  Device device;
  std::shared_ptr<CommRecord> record;
  std::shared_ptr<ProgressBoard> board;
  // The algorithm collectives issued now run with (Group::set_algorithm).
  mutable std::atomic<Algorithm> algorithm{Algorithm::mpi};
  const Backend& backend() const { return *worker_->backend; }

 private:
  Work enqueue(GroupWorker::Task task) const;
  std::shared_ptr<GroupWorker> worker_;
  std::thread thread_;
  // Sequence numbers: collectives and transfers separately, since only the collectives
  // are issued identically on every rank.
  mutable uint64_t next_seq_ = 1, next_transfer_seq_ = 1;
};

}  // namespace loom::comm
