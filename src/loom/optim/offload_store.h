// Where offloaded training state lives (parallel.offload): a host pool (MemCategory::offloaded)
// or a file in a directory, addressed in floats, with a blocking copy in either direction. The
// Adam moments' staging (optim/moment_offload.h) and ZeRO-3's parameter shards
// (parallel/shard_offload.h) each keep one and run its copies on their own I/O thread.
#pragma once
#include <cstdint>
#include <string>

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

}  // namespace loom::optim
