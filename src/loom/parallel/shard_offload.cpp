// ShardOffload: the host pool or the file, the I/O thread and its queue, the staged ranges.
#include "loom/parallel/shard_offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::parallel {

ShardOffload::ShardOffload(optim::OffloadTarget target, const std::string& dir, int64_t elems)
    : target_(target), elems_(elems) {
  LOOM_CHECK(target_ != optim::OffloadTarget::none, "offload", "ShardOffload needs a target, host or disk");
  if (target_ == optim::OffloadTarget::host) {
    pool_ = Tensor::zeros({std::max<int64_t>(1, elems_)}, DType::f32, MemCategory::offloaded);
  } else {
    LOOM_CHECK(!dir.empty(), "config", "parallel.offload.params=disk needs a directory (parallel.offload.dir)");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    path_ = (std::filesystem::path(dir) / ("params." + std::to_string(::getpid()) + "." +
                                           std::to_string(reinterpret_cast<uintptr_t>(this)) + ".bin"))
                .string();
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    LOOM_CHECK(fd_ >= 0, "offload", "cannot create ", path_, " for the parameter shards: ", std::strerror(errno),
               "; set parallel.offload.dir to a writable directory");
    LOOM_CHECK(::ftruncate(fd_, off_t(elems_) * off_t(sizeof(float))) == 0, "offload", "cannot size ", path_, " to ",
               format_bytes(elems_ * 4), ": ", std::strerror(errno));
  }
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
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void ShardOffload::copy(bool write, int64_t offset, int64_t n, float* buf) {
  LOOM_CHECK(offset >= 0 && offset + n <= elems_, "offload", "range [", offset, ", ", offset + n, ") outside the ",
             elems_, " offloaded parameters");
  if (target_ == optim::OffloadTarget::host) {
    float* home = pool_.data<float>() + offset;
    if (write)
      std::memcpy(home, buf, size_t(n) * sizeof(float));
    else
      std::memcpy(buf, home, size_t(n) * sizeof(float));
    return;
  }
  char* p = reinterpret_cast<char*>(buf);
  off_t at = off_t(offset) * off_t(sizeof(float));
  size_t left = size_t(n) * sizeof(float);
  while (left > 0) {
    const ssize_t got = write ? ::pwrite(fd_, p, left, at) : ::pread(fd_, p, left, at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail("offload", write ? "writing" : "reading", " the parameter shards in ", path_, ": ",
           got < 0 ? std::strerror(errno) : "short read", "; is parallel.offload.dir's disk full?");
    p += got;
    at += got;
    left -= size_t(got);
  }
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
      copy(j.write, j.offset, j.buf.numel(), j.buf.data<float>());
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
  copy(false, offset, n, dst);
}

void ShardOffload::write(int64_t offset, int64_t n, const float* src) {
  drop_staged();
  copy(true, offset, n, const_cast<float*>(src));
}

}  // namespace loom::parallel
