// The background writer behind asynchronous checkpoints (checkpoint.async): the training thread
// takes a snapshot of a step's state (checkpoint.h, a collective copy into rank 0's memory),
// hands it over and goes on training while a thread on rank 0 writes, checksums and renames it
// into place. At most one write is in flight; the previous checkpoint stays the valid one until
// the new one is complete, so a crash during the write loses only the write.
#pragma once
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "loom/train/checkpoint.h"

namespace loom::train {

class CheckpointWriter {
 public:
  struct Result {
    int64_t step = 0;
    bool ok = true;
    std::string path;    // the checkpoint directory when ok
    std::string error;   // why not, otherwise
    double seconds = 0;  // the write's duration on its thread
  };
  CheckpointWriter() = default;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  ~CheckpointWriter();  // waits for a write in flight (its result is then dropped)

  // Starts writing `snap` as dir/step_N on the writer thread. Refused while a write is in flight.
  void start(const std::string& dir, CheckpointSnapshot snap);
  // True from start() until the write's result has been taken by poll() or wait().
  bool pending() const { return started_; }
  // The finished write's result, or nullopt while it is still running (or none was started).
  std::optional<Result> poll();
  // Blocks until the write in flight has finished; nullopt when none was started.
  std::optional<Result> wait();
  // The buffers of the last finished write, for the next snapshot to fill again (rank 0).
  CheckpointSnapshot* spare() { return started_ ? nullptr : &snap_; }
  // Allocates (and touches) the snapshot buffers for the whole model now, so that the first
  // checkpoint's copy does not pay for fresh pages (seconds for a 124M-parameter model).
  void reserve(const model::ModelConfig& cfg, const model::ModelSlice& whole = {});

 private:
  std::thread thread_;
  std::mutex mu_;
  bool started_ = false, finished_ = false;
  Result result_;
  CheckpointSnapshot snap_;
};

}  // namespace loom::train
