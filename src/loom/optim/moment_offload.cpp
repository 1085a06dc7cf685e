// MomentOffload: the staging buffers, the I/O thread and its queue (the store holds the values).
#include "loom/optim/moment_offload.h"

#include <algorithm>
#include <cstring>

#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::optim {

MomentOffload::MomentOffload(OffloadTarget target, const std::string& dir, const std::vector<int64_t>& sizes,
                             int64_t piece_elems, int window)
    : window_(size_t(std::max(1, window))) {
  LOOM_CHECK(piece_elems > 0, "offload", "pieces need at least one element, got ", piece_elems);
  for (size_t u = 0; u < sizes.size(); ++u) {
    first_.push_back(pieces_.size());
    for (int64_t at = 0; at < sizes[u]; at += piece_elems) {
      const int64_t n = std::min(piece_elems, sizes[u] - at);
      pieces_.push_back({u, at, n});
      home_.push_back(2 * total_);
      total_ += n;
      widest_ = std::max(widest_, n);
    }
  }
  first_.push_back(pieces_.size());
  window_ = std::min(window_, std::max<size_t>(1, pieces_.size()));
  staging_ = Tensor::zeros({std::max<int64_t>(1, int64_t(window_) * 2 * widest_)}, DType::f32, MemCategory::optimizer);
  ready_.assign(pieces_.size(), false);
  // Both moments start at zero.
  store_ = std::make_unique<OffloadStore>(target, dir, 2 * total_, "the optimizer's moments", "moments",
                                          "parallel.offload.optimizer");
  thread_ = std::thread([this] { worker(); });
}

MomentOffload::~MomentOffload() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ == queued_ || !error_.empty(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

float* MomentOffload::buffer(size_t b) const { return const_cast<float*>(staging_.data<float>()) + b * 2 * widest_; }

void MomentOffload::copy(const Job& j) {
  store_->copy(j.write, home_[j.piece], 2 * pieces_[j.piece].size, buffer(j.buffer));
}

void MomentOffload::worker() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      j = queue_.front();
      queue_.pop_front();
    }
    std::string failed;
    try {
      trace::Span span(j.write ? "offload write" : "offload read", "io", {{"piece", int64_t(j.piece)}});
      copy(j);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed.empty() && error_.empty()) error_ = failed;
      if (!j.write) ready_[j.piece] = true;
      ++finished_;
    }
    cv_.notify_all();
  }
}

void MomentOffload::enqueue(Job j) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(j);
    ++queued_;
  }
  cv_.notify_all();
}

void MomentOffload::prefetch() {
  if (prefetched_) return;
  prefetched_ = true;
  next_read_ = 0;
  for (; next_read_ < std::min(window_, pieces_.size()); ++next_read_)
    enqueue({false, next_read_, next_read_ % window_});
}

float* MomentOffload::acquire(size_t k) {
  prefetch();
  LOOM_CHECK(k < next_read_, "offload", "piece ", k, " acquired out of order");
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_[k] || !error_.empty(); });
  if (!error_.empty()) throw Error(error_);
  ready_[k] = false;
  return buffer(k % window_);
}

void MomentOffload::release(size_t k) {
  enqueue({true, k, k % window_});
  if (next_read_ < pieces_.size()) {
    enqueue({false, next_read_, next_read_ % window_});
    ++next_read_;
  }
  if (k + 1 == pieces_.size()) prefetched_ = false;  // the next step starts over at piece 0
}

void MomentOffload::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ == queued_ || !error_.empty(); });
  if (!error_.empty()) throw Error(error_);
}

void MomentOffload::drop_prefetch() {
  flush();
  // A step whose update never came (a skipped non-finite step): its staged pieces are dropped and
  // read again by the next step, since buffer 0 is about to be overwritten.
  std::fill(ready_.begin(), ready_.end(), false);
  prefetched_ = false;
  next_read_ = 0;
}

void MomentOffload::read(size_t unit, float* m, float* v) {
  drop_prefetch();
  float* b = buffer(0);
  for (size_t k = first_[unit]; k < first_[unit + 1]; ++k) {
    const Piece& p = pieces_[k];
    copy({false, k, 0});
    std::memcpy(m + p.offset, b, size_t(p.size) * sizeof(float));
    std::memcpy(v + p.offset, b + p.size, size_t(p.size) * sizeof(float));
  }
}

void MomentOffload::write(size_t unit, const float* m, const float* v) {
  drop_prefetch();
  float* b = buffer(0);
  for (size_t k = first_[unit]; k < first_[unit + 1]; ++k) {
    const Piece& p = pieces_[k];
    std::memcpy(b, m + p.offset, size_t(p.size) * sizeof(float));
    std::memcpy(b + p.size, v + p.offset, size_t(p.size) * sizeof(float));
    copy({true, k, 0});
  }
}

}  // namespace loom::optim
