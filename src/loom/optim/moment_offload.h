// Adam's moments kept off the device between steps (parallel.offload.optimizer): in a host pool
// (MemCategory::offloaded) or in a file, and staged into two resident buffers a piece (at most a
// million elements of one unit) at a time for the update. One I/O thread runs the copies in the
// order they were asked for: the first pieces' reads start before the step (while the forward and
// backward run), each piece's write starts as soon as it is updated and the next piece's read
// follows it, so the step waits only for what the computation has not hidden. On a CPU machine
// "host" is a separate pool and "disk" a directory; what a GPU would copy over PCIe is copied here
// the same way, and the formulas (planner) and the overlap are what carry over.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/optim/offload_store.h"
#include "loom/optim/offload_target.h"

namespace loom::optim {

class MomentOffload {
 public:
  // A contiguous part of one unit's range, staged as a whole: [m | v], 2 * size floats.
  struct Piece {
    size_t unit = 0;
    int64_t offset = 0, size = 0;  // within the unit's range
  };
  // Units of `sizes[i]` elements (the ranges this rank's AdamWs own), both moments zero at first,
  // cut into pieces of at most `piece_elems` elements. disk: one file under `dir` (created if
  // missing; removed with this object). At most `window` pieces are staged at once.
  MomentOffload(OffloadTarget target, const std::string& dir, const std::vector<int64_t>& sizes,
                int64_t piece_elems = int64_t(1) << 20, int window = 2);
  ~MomentOffload();
  MomentOffload(const MomentOffload&) = delete;
  MomentOffload& operator=(const MomentOffload&) = delete;

  const Piece& piece(size_t k) const { return pieces_[k]; }
  // Unit i's pieces: [first, last).
  std::pair<size_t, size_t> pieces_of(size_t unit) const { return {first_[unit], first_[unit + 1]}; }
  // Starts reading the first pieces (no-op when already started): call before the step, so that
  // the reads run while the model computes.
  void prefetch();
  // Piece k's moments, staged ([m | v]), once read; pieces are taken in order 0, 1, ....
  float* acquire(size_t k);
  // Piece k is updated: its write back starts, and the read of piece k + window after it. After
  // the last piece the next step's prefetch starts over at piece 0.
  void release(size_t k);
  // A whole unit's moments, synchronously (checkpoints); a prefetch in flight is dropped and the
  // next acquire starts it again.
  void read(size_t unit, float* m, float* v);
  void write(size_t unit, const float* m, const float* v);
  // Resident bytes (the staging buffers) and bytes kept off the device (both moments).
  int64_t staged_bytes() const { return int64_t(staging_.nbytes()); }
  int64_t offloaded_bytes() const { return 2 * total_ * int64_t(sizeof(float)); }

 private:
  // Queues piece's copy between its staging buffer and the store (a read marks it ready).
  void enqueue(bool write, size_t piece);
  float* buffer(size_t b) const;
  void drop_prefetch();

  std::unique_ptr<OffloadStore> store_;  // both moments of every piece, [m | v] per piece
  std::vector<Piece> pieces_;
  std::vector<int64_t> home_;  // per piece: its [m | v]'s first element in the file or pool
  std::vector<size_t> first_;  // per unit: its first piece (and one past the last unit)
  int64_t total_ = 0, widest_ = 0;
  size_t window_;
  Tensor staging_;           // window_ buffers of 2 * widest_ floats (optimizer: resident)
  std::vector<bool> ready_;  // per piece: its staged copy was read and not yet acquired
  size_t next_read_ = 0;     // the next piece whose read is not yet queued
  bool prefetched_ = false;
  OffloadQueue io_;  // last: its thread goes first, before what its jobs touch
};

}  // namespace loom::optim
