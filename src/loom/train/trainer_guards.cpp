// The trainer's guard against loss spikes: a spike detector over a window of recent losses,
// and the roll-back to the newest checkpoint before the first spike, whose batches are then
// skipped (batch_of). Non-finite steps are skipped in the step itself (trainer.cpp).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/io/file.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/trainer.h"

namespace loom::train {

namespace fs = std::filesystem;

int64_t Trainer::batch_of(int64_t step) const {
  int64_t b = step;
  for (const auto& [from, count] : skipped_windows_)
    if (from <= step) b += count;
  return b;
}

bool Trainer::spike_detected(double loss) {
  const size_t W = size_t(cfg_.guard.spike_window);
  bool spike = false;
  double mean = 0, sd = 0;
  if (loss_window_.size() >= std::max<size_t>(4, W / 2)) {  // enough history to judge
    for (double l : loss_window_) mean += l;
    mean /= double(loss_window_.size());
    for (double l : loss_window_) sd += (l - mean) * (l - mean);
    sd = std::sqrt(sd / double(loss_window_.size() - 1));
    // A floor on the spread: a flat stretch of the curve must not turn noise into spikes.
    sd = std::max(sd, 1e-3 * std::abs(mean));
    spike = (loss - mean) / sd > cfg_.guard.spike_z;
  }
  if (!spike) {
    if (loss_window_.size() < W) {
      loss_window_.push_back(loss);
    } else {
      loss_window_[loss_window_next_] = loss;
      loss_window_next_ = (loss_window_next_ + 1) % W;
    }
    spikes_in_row_ = 0;
    return false;
  }
  if (spikes_in_row_ == 0) first_spike_step_ = step_;  // step_ is the 1-based number of the step just done
  ++spikes_in_row_;
  if (main_rank())
    std::fprintf(opt_.log,
                 "[guard] step %lld: loss %.4f is %.1f standard deviations above the mean %.4f of the last %zu "
                 "steps (spike %lld of guard.max_spikes=%lld in a row)\n",
                 (long long)step_, loss, (loss - mean) / sd, mean, loss_window_.size(), (long long)spikes_in_row_,
                 (long long)cfg_.guard.max_spikes);
  return spikes_in_row_ >= cfg_.guard.max_spikes;
}

void Trainer::roll_back() {
  finish_async_checkpoint(/*wait=*/true);
  const int64_t first = first_spike_step_, last = step_;
  spikes_in_row_ = 0;
  FILE* log = main_rank() ? opt_.log : nullptr;
  // The newest checkpoint from before the first spike's update.
  const auto found = find_latest_valid_checkpoint(cfg_.checkpoint.dir, log, checkpoint_load_scope(mesh_->world()),
                                                  &mesh_->world(), first - 1);
  if (!found) {
    if (log)
      std::fprintf(log, "[guard] no checkpoint from before step %lld to roll back to; training goes on\n",
                   (long long)first);
    return;
  }
  const CheckpointMeta meta =
      load_checkpoint(*found, *model_, *data_parallel_, model_parallel_info(), /*verified=*/true);
  if (main_rank()) {
    // Checkpoints this run saved after the target come from the spiking trajectory: a resume
    // must not pick them (the run saves those steps again as it goes).
    for (const CheckpointEntry& e : list_checkpoints(cfg_.checkpoint.dir))
      if (e.step > meta.step && checkpoint_run_id(e.path) == run_id_) {
        std::error_code ec;
        fs::remove_all(e.path, ec);
      }
    io::write_file_atomic((fs::path(cfg_.checkpoint.dir) / "latest").string(),
                          fs::path(*found).filename().string() + "\n");
  }
  step_ = meta.step;
  last_checkpoint_ = *found;
  if (scaler_.enabled() && meta.loss_scale > 0) scaler_.restore(meta.loss_scale, meta.loss_scale_clean_steps);
  // Steps first..last (1-based) trained on the batches that spiked: skip them from step `first` on.
  skipped_windows_.push_back({first - 1, last - first + 1});
  loss_window_.clear();
  loss_window_next_ = 0;
  ++rollbacks_;
  if (log) {
    std::fprintf(log, "[guard] rolled back to step %lld (%s); the batches of steps %lld-%lld are skipped\n",
                 (long long)step_, found->c_str(), (long long)first, (long long)last);
    std::fflush(log);
  }
  if (metrics_) {
    const nlohmann::json j = {{"event", "rollback"},
                              {"step", step_},
                              {"checkpoint", *found},
                              {"skipped_from_step", first},
                              {"skipped_steps", last - first + 1}};
    std::fprintf(metrics_, "%s\n", j.dump().c_str());
    std::fflush(metrics_);
  }
}

}  // namespace loom::train
