// The trainer's loss guards (the detectors are train/loss_guard.h): loss spikes, rolled back to
// the newest checkpoint before the first one with their batches skipped (batch_of), or logged
// and counted where there is nothing to roll back to; divergence, which stops the run (or
// warns); and the end of a stopped run, which leaves the newest checkpoint from before it as
// `latest`. Non-finite steps are skipped in the step itself (trainer.cpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "loom/io/file.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/trainer.h"

namespace loom::train {

namespace fs = std::filesystem;

const char* run_end_name(RunEnd e) {
  switch (e) {
    case RunEnd::finished: return "finished";
    case RunEnd::diverged: return "diverged";
    case RunEnd::nonfinite: return "nonfinite";
  }
  return "?";
}

int64_t Trainer::batch_of(int64_t step) const {
  int64_t b = step;
  for (const auto& [from, count] : skipped_windows_)
    if (from <= step) b += count;
  return b;
}

bool Trainer::spike_detected(double loss) {
  const SpikeVerdict v = spike_detector_.observe(loss);
  if (!v.spike) {
    spikes_in_row_ = 0;
    return false;
  }
  ++spikes_;
  if (spikes_in_row_ == 0) first_spike_step_ = step_;  // step_ is the 1-based number of the step just done
  ++spikes_in_row_;
  const bool can_roll_back = !cfg_.checkpoint.dir.empty();
  if (main_rank()) {
    std::fprintf(opt_.log,
                 "[guard] step %lld: loss spike: %.4f is %.1f standard deviations above the median %.4f of the "
                 "last %zu steps (spike %lld of guard.max_spikes=%lld in a row%s)\n",
                 (long long)step_, loss, v.z, v.median, v.window, (long long)spikes_in_row_,
                 (long long)cfg_.guard.max_spikes,
                 can_roll_back ? "" : "; no checkpoint.dir to roll back to, so it is only counted");
    std::fflush(opt_.log);
  }
  write_metrics_line(nlohmann::json{{"event", "spike"}, {"step", step_}, {"loss", loss}, {"z", v.z}}.dump());
  if (spikes_in_row_ < cfg_.guard.max_spikes) return false;
  if (can_roll_back) return true;
  // Nothing to roll back to: the loss has moved to a new level; judge from there on.
  spikes_in_row_ = 0;
  spike_detector_.clear();
  return false;
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
    spike_detector_.clear();  // judge the loss from its new level on
    return;
  }
  rollbacks_to_target_ = *found == last_rollback_target_ ? rollbacks_to_target_ + 1 : 1;
  last_rollback_target_ = *found;
  if (rollbacks_to_target_ >= 3) {  // it spikes from there whatever the batches
    const std::string what =
        str_cat("the loss spiked again after each of two rollbacks to ", fs::path(*found).filename().string(),
                ", whatever the batches (spikes at steps ", first, "-", last, ")");
    if (cfg_.guard.divergence == Divergence::stop) {
      divergence_.restart(checkpoint_step_of(*found));
      stop_run(RunEnd::diverged, what, checkpoint_step_of(*found));  // the target is as good as it gets
      return;
    }
    // Rolling back again would skip batches for ever: count the spikes from here on.
    if (log)
      std::fprintf(log, "[guard] %s; no more rollbacks to it (guard.divergence=%s)\n", what.c_str(),
                   divergence_name(cfg_.guard.divergence));
    spike_detector_.clear();
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
  // The spike window is kept: the losses before the spikes judge the steps trained again, so
  // spikes that come back right after the rollback are seen.
  divergence_.restart(step_);
  ++rollbacks_;
  if (log) {
    std::fprintf(log, "[guard] rolled back to step %lld (%s); the batches of steps %lld-%lld are skipped\n",
                 (long long)step_, found->c_str(), (long long)first, (long long)last);
    std::fflush(log);
  }
  write_metrics_line(nlohmann::json{
      {"event", "rollback"},
      {"step", step_},
      {"checkpoint", *found},
      {"skipped_from_step", first},
      {"skipped_steps",
       last - first + 1}}.dump());
}

bool Trainer::divergence_detected(double loss) {
  if (cfg_.guard.divergence == Divergence::off) return false;
  const bool was_diverging = divergence_.steps_above() >= cfg_.guard.divergence_steps;
  if (!divergence_.observe(step_, loss) || was_diverging) return false;
  const std::string what = str_cat("the smoothed loss ", divergence_.smoothed(),
                                   " has stayed above guard.divergence_factor=", cfg_.guard.divergence_factor,
                                   " x its minimum ", divergence_.minimum(), " (step ", divergence_.minimum_step(),
                                   ") for guard.divergence_steps=", cfg_.guard.divergence_steps, " steps, since step ",
                                   divergence_.above_since());
  if (cfg_.guard.divergence == Divergence::stop) {
    stop_run(RunEnd::diverged, what);
    return true;
  }
  ++divergence_warnings_;
  if (main_rank()) {
    std::fprintf(opt_.log,
                 "[guard] step %lld: WARNING: the run is diverging: %s; it began after step %lld "
                 "(guard.divergence=warn: training goes on)\n",
                 (long long)step_, what.c_str(), (long long)divergence_.last_healthy_step());
    std::fflush(opt_.log);
  }
  write_metrics_line(
      nlohmann::json{{"event", "divergence"}, {"step", step_}, {"began_after", divergence_.last_healthy_step()}}
          .dump());
  return false;
}

int64_t Trainer::fallback_step() const {
  // Step s reports the loss of the weights saved at step s-1: the checkpoint of the step before
  // the first non-finite loss holds the weights that gave it (an update can overflow them). A
  // divergence is a trend, not a step: its last healthy step's checkpoint is kept.
  int64_t upto = std::numeric_limits<int64_t>::max();
  if (!divergence_.healthy()) upto = divergence_.last_healthy_step();
  if (consecutive_nonfinite_ > 0) upto = std::min(upto, first_nonfinite_step_ - 2);
  if (spikes_in_row_ > 0) upto = std::min(upto, first_spike_step_ - 1);  // a rollback's target
  return upto == std::numeric_limits<int64_t>::max() ? -1 : upto;
}

void Trainer::stop_run(RunEnd why, const std::string& reason, int64_t keep_upto) {
  try {
    finish_async_checkpoint(/*wait=*/true);
  } catch (const std::exception& e) {  // every rank throws alike; the cleanup below still runs
    if (main_rank()) std::fprintf(opt_.log, "[guard] the last background checkpoint failed: %s\n", e.what());
  }
  ended_ = why;
  // Where it began: the step before the first non-finite one, or the last healthy step of the
  // smoothed loss, whichever is earlier.
  int64_t healthy = why == RunEnd::nonfinite ? first_nonfinite_step_ - 1 : divergence_.last_healthy_step();
  if (!divergence_.healthy()) healthy = std::min(healthy, divergence_.last_healthy_step());
  last_healthy_step_ = std::max<int64_t>(healthy, 0);
  if (keep_upto < -1) {
    keep_upto = why == RunEnd::nonfinite ? last_healthy_step_ - 1 : last_healthy_step_;
    if (const int64_t f = fallback_step(); f >= 0) keep_upto = std::min(keep_upto, f);
  }
  std::string kept = "checkpoint.dir is not set";
  if (!cfg_.checkpoint.dir.empty()) {
    // Checkpoints up to keep_upto stay; the later ones hold weights of the diverging trajectory,
    // which a resume must not pick.
    std::string fallback;
    if (main_rank()) {
      for (const CheckpointEntry& e : list_checkpoints(cfg_.checkpoint.dir)) {  // highest step first
        if (e.step > keep_upto && checkpoint_run_id(e.path) == run_id_) {
          std::error_code ec;
          fs::remove_all(e.path, ec);
        } else if (fallback.empty() && e.step <= keep_upto) {
          fallback = e.path;
        }
      }
      const std::string latest = (fs::path(cfg_.checkpoint.dir) / "latest").string();
      std::error_code ec;
      if (!fallback.empty())
        io::write_file_atomic(latest, fs::path(fallback).filename().string() + "\n");
      else
        fs::remove(latest, ec);
    }
    // Every rank ends with the same view of what is left (rank 0 looked).
    Tensor step = Tensor::from_vector<int64_t>({fallback.empty() ? -1 : checkpoint_step_of(fallback)}, {1});
    mesh_->world().broadcast(step, 0);
    const int64_t kept_step = step.data<int64_t>()[0];
    last_checkpoint_ = kept_step < 0 ? "" : checkpoint_path(cfg_.checkpoint.dir, kept_step);
    kept = kept_step >= 0 ? str_cat("latest is ", last_checkpoint_, " (resume from it with lower optim.lr)")
                          : str_cat("no checkpoint in ", cfg_.checkpoint.dir, " is from before it");
  }
  DivergenceSuspects s;
  s.lr = cfg_.optim.lr;
  s.beta2 = cfg_.optim.beta2;
  s.eps = cfg_.optim.eps;
  s.clip_max_norm = cfg_.schedule.clip_max_norm;
  s.clip_dynamic = cfg_.schedule.clip_dynamic;
  s.warmup_steps = cfg_.schedule.warmup_steps;
  std::string causes;
  for (const std::string& c : likely_divergence_causes(s)) causes += (causes.empty() ? "" : "; ") + c;
  end_reason_ = str_cat(
      why == RunEnd::diverged ? "training diverged: " : "training stopped on non-finite values: ", reason,
      "; it began after step ", last_healthy_step_, ". Likely causes: ",
      causes.empty() ? "none of the usual settings (look at the data and the initialisation)" : causes, ". ", kept);
  if (main_rank()) {
    std::fprintf(opt_.log, "[guard] step %lld: %s\n", (long long)step_ + (why == RunEnd::nonfinite ? 1 : 0),
                 end_reason_.c_str());
    std::fflush(opt_.log);
  }
}

}  // namespace loom::train
