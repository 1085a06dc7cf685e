// The per-group worker thread: runs a group's operations in issue order with blocking
// backend calls, so communication progresses while the caller computes (Open MPI's
// non-blocking collectives barely progress unless MPI is being called). Point-to-point transfers
// of a transport that takes calls from any thread are posted by the issuing thread and polled by
// the worker and by whoever waits on them (GroupWorker::posted).
#include <chrono>
#include <thread>

#include "loom/comm/group_impl.h"
#include "loom/core/error.h"

namespace loom::comm {

void WorkState::complete(std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    error = std::move(e);
    done = true;
  }
  cv.notify_all();
}

void Work::wait() const {
  if (!state_) return;
  if (std::shared_ptr<GroupWorker> poller = state_->poller.lock()) {
    while (!test()) {
      poller->poll();
      if (!test()) std::this_thread::yield();
    }
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

namespace {

std::exception_ptr with_context(const std::exception& e, const std::string& label, const std::string& group) {
  return std::make_exception_ptr(Error(str_cat(e.what(), " (", label, " on group '", group, "')")));
}

}  // namespace

void GroupWorker::run_task(Task& t) {
  std::string label = op_label(t.op, t.seq);
  uint64_t h = record->start(t.op, group_name, t.bytes, t.seq, lane.key);
  // Only collectives go on the board: their numbers agree across the group's ranks.
  if (board && !t.post) board->started(lane.index, t.op, t.seq);
  try {
    if (t.post) {
      Posted p{t.post(*backend), h, label, t.work};
      std::lock_guard<std::mutex> lock(poll_mu);
      posted.push_back(std::move(p));
      n_posted = posted.size();
      return;
    }
    t.run(*backend);
    record->finish(h, true);
    if (board) board->completed(lane.index, t.op, t.seq);
    t.work->complete(nullptr);
  } catch (const std::exception& e) {
    record->finish(h, false);
    t.work->complete(with_context(e, label, group_name));
  }
}

bool GroupWorker::poll() {
  std::unique_lock<std::mutex> lock(poll_mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  for (auto it = posted.begin(); it != posted.end();) {
    bool done = false;
    std::exception_ptr err;
    try {
      done = it->transfer->test();
    } catch (const std::exception& e) {
      done = true;
      err = with_context(e, it->label, group_name);
    }
    if (!done) {
      ++it;
      continue;
    }
    record->finish(it->record_handle, err == nullptr);
    it->work->complete(err);
    it = posted.erase(it);
  }
  n_posted = posted.size();
  return true;
}

void GroupWorker::loop() {
  for (;;) {
    Task task;
    bool have = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      auto ready = [&] { return !queue.empty() || stopping; };
      if (n_posted == 0) {
        cv.wait(lock, [&] { return ready() || n_posted > 0; });
      } else {
        // Transfers need polling; a short sleep keeps an idle rank off the CPU.
        cv.wait_for(lock, std::chrono::microseconds(50), ready);
      }
      if (abandon) {
        for (auto& t : queue)
          t.work->complete(std::make_exception_ptr(
              Error(str_cat("[comm] ", op_label(t.op, t.seq), " on group '", group_name,
                            "' was dropped: the group was destroyed while the process failed"))));
        queue.clear();
        return;
      }
      if (!queue.empty()) {
        task = std::move(queue.front());
        queue.pop_front();
        have = running = true;
      } else if (stopping && n_posted == 0) {
        return;
      }
    }
    if (have) {
      run_task(task);
      std::lock_guard<std::mutex> lock(mu);
      running = false;
    }
    if (n_posted > 0) poll();
  }
}

GroupImpl::GroupImpl(std::unique_ptr<Backend> b, std::string n, std::shared_ptr<CommRecord> r,
                     std::shared_ptr<ProgressBoard> pb)
    : rank(b->rank()),
      size(b->size()),
      name(std::move(n)),
      backend_name(b->name()),
      device(b->device()),
      record(std::move(r)),
      board(std::move(pb)),
      worker_(std::make_shared<GroupWorker>()) {
  if (board) worker_->lane = board->join(name, b->world_ranks());
  algorithm = b->algorithm();
  worker_->backend = std::move(b);
  worker_->group_name = name;
  worker_->record = record;
  worker_->board = board;
  thread_ = std::thread([w = worker_] { w->loop(); });
}

GroupImpl::~GroupImpl() {
  // Unwinding means this process is failing: its peers may never answer, so do not wait
  // for queued work (the thread may stay blocked in the transport until the process ends).
  bool failing = std::uncaught_exceptions() > 0;
  {
    std::lock_guard<std::mutex> lock(worker_->mu);
    worker_->stopping = true;
    worker_->abandon = failing;
  }
  worker_->cv.notify_all();
  if (failing)
    thread_.detach();
  else
    thread_.join();
  if (board) board->leave(worker_->lane);
}

Work GroupImpl::enqueue(GroupWorker::Task task) const {
  auto state = std::make_shared<WorkState>();
  if (task.post && worker_->backend->posts_from_any_thread()) state->poller = worker_;
  task.work = state;
  {
    std::lock_guard<std::mutex> lock(worker_->mu);
    task.seq = task.post ? next_transfer_seq_++ : next_seq_++;
    worker_->queue.push_back(std::move(task));
  }
  worker_->cv.notify_one();
  return Work(std::move(state));
}

Work GroupImpl::submit(const char* op, int64_t bytes, std::function<void(Backend&)> run) const {
  GroupWorker::Task t;
  t.op = op;
  t.bytes = bytes;
  t.run = std::move(run);
  if (size == 1) {
    // A group of one has nobody to wait for: run on the caller's thread instead of paying two
    // thread hand-offs per operation (it matters when every step issues dozens of them), but
    // only when the worker is idle, so operations still run one at a time in issue order. The
    // lock stays held while it runs, which keeps the worker from starting anything meanwhile.
    std::unique_lock<std::mutex> lock(worker_->mu);
    if (worker_->queue.empty() && !worker_->running) {
      auto state = std::make_shared<WorkState>();
      t.work = state;
      t.seq = next_seq_++;
      worker_->run_task(t);
      return Work(std::move(state));
    }
  }
  return enqueue(std::move(t));
}

Work GroupImpl::submit_transfer(const char* op, int64_t bytes,
                                std::function<std::unique_ptr<PendingTransfer>(Backend&)> post) const {
  GroupWorker::Task t;
  t.op = op;
  t.bytes = bytes;
  t.post = std::move(post);
  if (worker_->backend->posts_from_any_thread()) {
    // Posted here, unless something issued before it still waits for the worker (issue order
    // holds): the transfer is under way when this returns, not when the worker next gets a core.
    // The lock keeps the worker from popping a task meanwhile; the worker only polls it.
    std::unique_lock<std::mutex> lock(worker_->mu);
    if (worker_->queue.empty() && !worker_->running && !worker_->stopping) {
      auto state = std::make_shared<WorkState>();
      state->poller = worker_;
      t.work = state;
      t.seq = next_transfer_seq_++;
      worker_->run_task(t);
      lock.unlock();
      worker_->cv.notify_one();  // from a wait without a timeout to polling
      return Work(std::move(state));
    }
  }
  return enqueue(std::move(t));
}

Group make_group(std::unique_ptr<Backend> backend, const std::string& name, std::shared_ptr<CommRecord> record,
                 std::shared_ptr<ProgressBoard> board) {
  return Group(std::make_shared<GroupImpl>(std::move(backend), name, std::move(record), std::move(board)));
}

}  // namespace loom::comm
