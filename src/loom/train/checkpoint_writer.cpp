#include "loom/train/checkpoint_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loom/core/error.h"
#include "loom/core/timer.h"

namespace loom::train {

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::start(const std::string& dir, CheckpointSnapshot snap) {
  LOOM_CHECK(!started_, "checkpoint", "a checkpoint write is already in flight (step ", result_.step, ")");
  if (thread_.joinable()) thread_.join();
  snap_ = std::move(snap);
  started_ = true;
  finished_ = false;
  result_ = Result{};
  result_.step = snap_.step;
  thread_ = std::thread([this, dir] {
    // Below the training threads: on a machine whose cores all train, the write takes the
    // slack instead of slowing the steps (Linux's nice value is per thread).
    setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), 10);
    Result r;
    r.step = snap_.step;
    Stopwatch sw;
    try {
      r.path = write_checkpoint(dir, snap_);
    } catch (const std::exception& e) {
      r.ok = false;
      r.error = e.what();
    }
    r.seconds = sw.seconds();
    std::lock_guard<std::mutex> lock(mu_);
    result_ = r;
    finished_ = true;
  });
}

void CheckpointWriter::reserve(const model::ModelConfig& cfg, const model::ModelSlice& whole) {
  if (started_) return;
  snap_.layout = std::make_shared<const model::ParamLayout>(cfg, 1, whole);
  const int64_t n = snap_.layout->total();
  snap_.weights = Tensor::zeros({n}, DType::f32, MemCategory::workspace);
  snap_.exp_avg = Tensor::zeros({n}, DType::f32, MemCategory::workspace);
  snap_.exp_avg_sq = Tensor::zeros({n}, DType::f32, MemCategory::workspace);
}

std::optional<CheckpointWriter::Result> CheckpointWriter::poll() {
  if (!started_) return std::nullopt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) return std::nullopt;
  }
  thread_.join();
  started_ = false;
  return result_;
}

std::optional<CheckpointWriter::Result> CheckpointWriter::wait() {
  if (!started_) return std::nullopt;
  thread_.join();
  started_ = false;
  return result_;
}

}  // namespace loom::train
