// ShardOffload: the I/O thread and its queue, the staged ranges (the store holds the values).
#include "loom/parallel/shard_offload.h"

#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::parallel {

ShardOffload::ShardOffload(optim::OffloadTarget target, const std::string& dir, int64_t elems)
    : store_(target, dir, elems, "the parameter shards", "params", "parallel.offload.params") {
  thread_ = std::thread([this] { worker(); });
}

ShardOffload::~ShardOffload() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ == queued_ || !error_.empty(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ShardOffload::worker() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      j = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string failed;
    try {
      trace::Span span(j.write ? "offload write" : "offload read", "io", {{"offset", j.offset}});
      store_.copy(j.write, j.offset, j.buf.numel(), j.buf.data<float>());
    } catch (const std::exception& e) {
      failed = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed.empty() && error_.empty()) error_ = failed;
      if (j.write)
        --pending_writes_;
      else if (auto it = staged_.find(j.offset);
               it != staged_.end() && it->second.buf.data<float>() == j.buf.data<float>())
        it->second.ready = true;
      j.buf = Tensor{};  // a written chunk's last owner may be this job
      ++finished_;
    }
    cv_.notify_all();
  }
}

void ShardOffload::enqueue(Job j) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(j));
    ++queued_;
  }
  cv_.notify_all();
}

void ShardOffload::prefetch(int64_t offset, int64_t n) {
  Tensor buf;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (staged_.count(offset)) return;
    buf = Tensor::empty({n}, DType::f32, MemCategory::params);
    staged_[offset] = {buf, false};
  }
  enqueue({false, offset, buf});
}

Tensor ShardOffload::take(int64_t offset, int64_t n) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = staged_.find(offset);
    if (it != staged_.end()) {
      cv_.wait(lock, [&] { return it->second.ready || !error_.empty(); });
      if (!error_.empty()) throw Error(error_);
      LOOM_CHECK(it->second.buf.numel() == n, "offload", "range at ", offset, " staged with ", it->second.buf.numel(),
                 " values, taken with ", n);
      Tensor out = std::move(it->second.buf);
      staged_.erase(it);
      return out;
    }
  }
  prefetch(offset, n);
  return take(offset, n);
}

void ShardOffload::write_back(int64_t offset, Tensor chunk) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    staged_.erase(offset);  // a read staged before this write would be stale
    cv_.wait(lock, [&] { return pending_writes_ < 1 || !error_.empty(); });
    if (!error_.empty()) throw Error(error_);
    ++pending_writes_;
  }
  enqueue({true, offset, std::move(chunk)});
}

void ShardOffload::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ == queued_ || !error_.empty(); });
  if (!error_.empty()) throw Error(error_);
}

void ShardOffload::drop_staged() {
  flush();
  std::lock_guard<std::mutex> lock(mu_);
  staged_.clear();
}

void ShardOffload::read(int64_t offset, int64_t n, float* dst) {
  drop_staged();
  store_.copy(false, offset, n, dst);
}

void ShardOffload::write(int64_t offset, int64_t n, const float* src) {
  drop_staged();
  store_.copy(true, offset, n, const_cast<float*>(src));
}

}  // namespace loom::parallel
