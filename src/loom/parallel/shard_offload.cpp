// ShardOffload: the staged ranges and the writes in flight (the store holds the values, the
// queue runs the copies).
#include "loom/parallel/shard_offload.h"

#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::parallel {

ShardOffload::ShardOffload(optim::OffloadTarget target, const std::string& dir, int64_t elems)
    : store_(target, dir, elems, "the parameter shards", "params", "parallel.offload.params") {}

ShardOffload::~ShardOffload() = default;

void ShardOffload::prefetch(int64_t offset, int64_t n) {
  Tensor buf;
  {
    std::lock_guard<std::mutex> lock(io_.mutex());
    if (staged_.count(offset)) return;
    buf = Tensor::empty({n}, DType::f32, MemCategory::params);
    staged_[offset] = {buf, false};
  }
  io_.post(
      [this, offset, buf] {
        trace::Span span("offload read", "io", {{"offset", offset}});
        store_.copy(false, offset, buf.numel(), buf.data<float>());
      },
      [this, offset, buf] {  // unless a write of the range dropped it meanwhile
        if (auto it = staged_.find(offset); it != staged_.end() && it->second.buf.data<float>() == buf.data<float>())
          it->second.ready = true;
      });
}

Tensor ShardOffload::take(int64_t offset, int64_t n) {
  {
    std::unique_lock<std::mutex> lock(io_.mutex());
    auto it = staged_.find(offset);
    if (it != staged_.end()) {
      io_.wait(lock, [&] { return it->second.ready; });
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
    std::unique_lock<std::mutex> lock(io_.mutex());
    staged_.erase(offset);  // a read staged before this write would be stale
    io_.wait(lock, [&] { return pending_writes_ < 1; });
    ++pending_writes_;
  }
  io_.post(
      [this, offset, chunk] {
        trace::Span span("offload write", "io", {{"offset", offset}});
        store_.copy(true, offset, chunk.numel(), chunk.data<float>());
      },
      [this] { --pending_writes_; });
}

void ShardOffload::drop_staged() {
  io_.flush();
  std::lock_guard<std::mutex> lock(io_.mutex());
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
