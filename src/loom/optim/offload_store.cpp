// OffloadStore: the host pool, or the file and its positioned reads and writes; OffloadQueue:
// the thread that runs them.
#include "loom/optim/offload_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"

namespace loom::optim {

OffloadStore::OffloadStore(OffloadTarget target, const std::string& dir, int64_t elems, const std::string& what,
                           const std::string& stem, const std::string& key)
    : target_(target), elems_(elems), what_(what) {
  LOOM_CHECK(target_ != OffloadTarget::none, "offload", "an offload store needs a target, host or disk");
  if (target_ == OffloadTarget::host) {
    pool_ = Tensor::zeros({std::max<int64_t>(1, elems_)}, DType::f32, MemCategory::offloaded);
    return;
  }
  LOOM_CHECK(!dir.empty(), "config", key, "=disk needs a directory (parallel.offload.dir)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  static std::atomic<int> made{0};
  path_ =
      (std::filesystem::path(dir) / (stem + "." + std::to_string(::getpid()) + "." + std::to_string(made++) + ".bin"))
          .string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  LOOM_CHECK(fd_ >= 0, "offload", "cannot create ", path_, " for ", what_, ": ", std::strerror(errno),
             "; set parallel.offload.dir to a writable directory");
  // Zero-filled as a sparse file.
  LOOM_CHECK(::ftruncate(fd_, off_t(elems_) * off_t(sizeof(float))) == 0, "offload", "cannot size ", path_, " to ",
             format_bytes(elems_ * 4), ": ", std::strerror(errno));
}

OffloadStore::~OffloadStore() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

void OffloadStore::copy(bool write, int64_t offset, int64_t n, float* buf) {
  LOOM_CHECK(offset >= 0 && n >= 0 && offset + n <= elems_, "offload", "range [", offset, ", ", offset + n,
             ") outside the ", elems_, " values of ", what_);
  if (target_ == OffloadTarget::host) {
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
      fail("offload", write ? "writing " : "reading ", what_, " in ", path_, ": ",
           got < 0 ? std::strerror(errno) : "short read", "; is parallel.offload.dir's disk full?");
    p += got;
    at += got;
    left -= size_t(got);
  }
}

OffloadQueue::OffloadQueue() : thread_([this] { run(); }) {}

OffloadQueue::~OffloadQueue() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ == posted_ || !error_.empty(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OffloadQueue::run() {
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
      j.copy();
    } catch (const std::exception& e) {
      failed = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed.empty() && error_.empty()) error_ = failed;
      if (j.done) j.done();
      j = {};  // what the job held (a buffer being written) goes here, under the lock
      ++finished_;
    }
    cv_.notify_all();
  }
}

void OffloadQueue::post(std::function<void()> copy, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(copy), std::move(done)});
    ++posted_;
  }
  cv_.notify_all();
}

void OffloadQueue::wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
  cv_.wait(lock, [&] { return ready() || !error_.empty(); });
  if (!error_.empty()) throw Error(error_);
}

void OffloadQueue::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  wait(lock, [&] { return finished_ == posted_; });
}

}  // namespace loom::optim
