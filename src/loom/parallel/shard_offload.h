// ZeRO-3's parameter chunks kept off the device (parallel.offload.params): this rank's fp32
// chunks, concatenated in unit order, live in a host pool (MemCategory::offloaded) or in a file,
// and a unit's chunk is staged into a resident buffer only while it is used: read before its
// all-gather (ahead of time, on an I/O thread, for the unit the pass will gather next) and before
// the optimizer updates it, written back after the update. One I/O thread runs the copies in the
// order they were asked for, so a read asked after a write of the same range sees it. As with the
// optimizer's moments (optim/moment_offload.h), "host" is a separate pool and "disk" a directory
// on a CPU machine; the formulas and the overlap are what carry over to a GPU.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "loom/core/tensor.h"
#include "loom/optim/offload_store.h"
#include "loom/optim/offload_target.h"

namespace loom::parallel {

class ShardOffload {
 public:
  // `elems` floats, zero at first. disk: one file under `dir` (created if missing; removed with
  // this object).
  ShardOffload(optim::OffloadTarget target, const std::string& dir, int64_t elems);
  ~ShardOffload();
  ShardOffload(const ShardOffload&) = delete;
  ShardOffload& operator=(const ShardOffload&) = delete;

  // Starts reading [offset, offset + n) into a staging buffer (nothing when it is staged or on
  // its way already).
  void prefetch(int64_t offset, int64_t n);
  // That range's values in a resident buffer of its own: the staged one once read (the
  // staging is handed over), else read now. Kept alive by the caller as long as it needs it.
  Tensor take(int64_t offset, int64_t n);
  // Writes `chunk` (n floats, kept alive until written) back to [offset, offset + n). One write
  // waits at a time (a second waits for it), so that the optimizer stages at most three chunks:
  // the one written back, the one it updates and the next one being read.
  void write_back(int64_t offset, Tensor chunk);
  // Synchronous copies (initial values, checkpoints): drops whatever is staged.
  void read(int64_t offset, int64_t n, float* dst);
  void write(int64_t offset, int64_t n, const float* src);
  // Drops staged ranges nobody took (the end of a pass).
  void drop_staged();
  int64_t offloaded_bytes() const { return store_.elems() * int64_t(sizeof(float)); }

 private:
  struct Staged {
    Tensor buf;
    bool ready = false;
  };

  optim::OffloadStore store_;
  std::map<int64_t, Staged> staged_;  // by offset; under io_.mutex()
  int pending_writes_ = 0;            // under io_.mutex()
  optim::OffloadQueue io_;            // last: its thread goes first, before what its jobs touch
};

}  // namespace loom::parallel
