// MomentOffload: the staging buffers and which pieces are staged (the store holds the values, the
// queue runs the copies).
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
}

MomentOffload::~MomentOffload() = default;

float* MomentOffload::buffer(size_t b) const { return const_cast<float*>(staging_.data<float>()) + b * 2 * widest_; }

void MomentOffload::enqueue(bool write, size_t piece) {
  const size_t b = piece % window_;
  io_.post(
      [this, write, piece, b] {
        trace::Span span(write ? "offload write" : "offload read", "io", {{"piece", int64_t(piece)}});
        store_->copy(write, home_[piece], 2 * pieces_[piece].size, buffer(b));
      },
      [this, write, piece] {
        if (!write) ready_[piece] = true;
      });
}

void MomentOffload::prefetch() {
  if (prefetched_) return;
  prefetched_ = true;
  next_read_ = 0;
  for (; next_read_ < std::min(window_, pieces_.size()); ++next_read_) enqueue(false, next_read_);
}

float* MomentOffload::acquire(size_t k) {
  prefetch();
  LOOM_CHECK(k < next_read_, "offload", "piece ", k, " acquired out of order");
  std::unique_lock<std::mutex> lock(io_.mutex());
  io_.wait(lock, [&] { return bool(ready_[k]); });
  ready_[k] = false;
  return buffer(k % window_);
}

void MomentOffload::release(size_t k) {
  enqueue(true, k);
  if (next_read_ < pieces_.size()) enqueue(false, next_read_++);
  if (k + 1 == pieces_.size()) prefetched_ = false;  // the next step starts over at piece 0
}

void MomentOffload::drop_prefetch() {
  io_.flush();
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
    store_->copy(false, home_[k], 2 * pieces_[k].size, b);
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
    store_->copy(true, home_[k], 2 * pieces_[k].size, b);
  }
}

}  // namespace loom::optim
