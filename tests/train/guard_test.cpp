// Guards and asynchronous checkpoints on a tiny model and a slice of Tiny Shakespeare: a
// non-finite loss skips exactly its update; too many in a row stop the run; loss spikes roll
// back to the checkpoint before them and skip their batches, exactly like a run that never saw
// those batches, also across a resume; a background checkpoint writes the same bytes as a
// synchronous one and resumes exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "loom/io/file.h"
#include "loom/train/checkpoint.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;
namespace fs = std::filesystem;

namespace {

using loom::testing::quiet;

struct Fixture {
  std::string dir, data;
  explicit Fixture(const std::string& name)
      : dir(loom::testing::temp_dir(name)), data(loom::testing::prepare_shakespeare(dir, 20000)) {}
  TrainConfig config(std::vector<std::string> sets, const std::string& ck = "") const {
    return parse_train_config(loom::testing::tiny_config_yaml(data, ck.empty() ? "" : dir + "/" + ck), sets);
  }
};

// Steps from `from` (0-based) on train on the batch `shift` further: a run that skipped batches.
class ShiftedSource : public BatchSource {
 public:
  ShiftedSource(BatchSource& inner, int64_t from, int64_t shift) : in_(inner), from_(from), shift_(shift) {}
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t G, int64_t T, int32_t* tok, int32_t* tgt,
                  int32_t* pos) override {
    in_.fill_train(step >= from_ ? step + shift_ : step, first, n, G, T, tok, tgt, pos);
  }
  void fill_val(int64_t i, int64_t B, int64_t T, int32_t* tok, int32_t* tgt, int32_t* pos) override {
    in_.fill_val(i, B, T, tok, tgt, pos);
  }
  int64_t vocab_size() const override { return in_.vocab_size(); }
  bool has_val() const override { return in_.has_val(); }
  std::string tokenizer_name() const override { return in_.tokenizer_name(); }

 private:
  BatchSource& in_;
  int64_t from_, shift_;
};

std::vector<float> weights(Trainer& t) { return t.model().params().to_f32_vector(); }

}  // namespace

TEST(Guard, NonFiniteLossSkipsExactlyItsUpdate) {
  Fixture f("guard_nan");
  const TrainConfig cfg = f.config({"schedule.steps=6", "schedule.eval_interval=0"});
  DatasetSource src(cfg);
  Trainer two(cfg, src, quiet("", 2));
  two.run();
  TrainerOptions o = quiet("", 3);
  o.inject_loss_factor_at = {{3, std::numeric_limits<double>::quiet_NaN()}};
  Trainer three(cfg, src, o);
  const TrainResult r = three.run();
  EXPECT_EQ(r.nonfinite_steps, 1);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_TRUE(std::isnan(r.losses[2]));
  EXPECT_EQ(weights(three), weights(two)) << "step 3's update was applied";
  // guard.nonfinite=stop: the run stops at that step, naming it.
  const TrainConfig stop_cfg = f.config({"schedule.steps=6", "schedule.eval_interval=0", "guard.nonfinite=stop"});
  {
    Trainer t(stop_cfg, src, o);
    const TrainResult s = t.run();
    EXPECT_EQ(s.ended, RunEnd::nonfinite) << "guard.nonfinite=stop did not stop";
    EXPECT_EQ(s.steps, 3);
    EXPECT_NE(s.end_reason.find("loss is nan at step 3"), std::string::npos) << s.end_reason;
    EXPECT_EQ(s.last_healthy_step, 2);
  }
  // More non-finite steps in a row than guard.max_consecutive_skips stop the run.
  const TrainConfig two_max =
      f.config({"schedule.steps=6", "schedule.eval_interval=0", "guard.max_consecutive_skips=2"});
  o.stop_after_steps = -1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  o.inject_loss_factor_at = {{2, nan}, {3, nan}, {4, nan}};
  Trainer t(two_max, src, o);
  const TrainResult s = t.run();
  EXPECT_EQ(s.ended, RunEnd::nonfinite) << "3 non-finite steps in a row went on";
  EXPECT_EQ(s.steps, 4);
  EXPECT_NE(s.end_reason.find("3 steps in a row"), std::string::npos) << s.end_reason;
  EXPECT_EQ(s.last_healthy_step, 1);
}

TEST(Guard, LossSpikesRollBackAndSkipTheirBatchesExactly) {
  Fixture f("guard_spike");
  const std::vector<std::string> sets = {
      "schedule.steps=16", "schedule.eval_interval=0", "checkpoint.every_steps=4", "checkpoint.keep_last=5",
      "guard.spike_z=4",   "guard.spike_window=8",     "guard.max_spikes=2"};
  const TrainConfig cfg = f.config(sets, "ck");
  DatasetSource src(cfg);
  TrainerOptions o = quiet();
  o.inject_loss_factor_at = {{10, 100.0}, {11, 100.0}};  // steps 10 and 11 spike; 9 was normal
  Trainer t(cfg, src, o);
  const TrainResult r = t.run();
  EXPECT_EQ(r.rollbacks, 1);
  EXPECT_EQ(r.steps, 16);
  // Steps 1-11, then back to the step-8 checkpoint and steps 9-16 again.
  EXPECT_EQ(r.losses.size(), 11u + 8u);
  // A run that never saw batches 10 and 11: steps 1-9 as usual, then every batch two further on.
  const TrainConfig plain = f.config({"schedule.steps=16", "schedule.eval_interval=0"});
  ShiftedSource shifted(src, 9, 2);
  Trainer ref(plain, shifted, quiet());
  ref.run();
  EXPECT_EQ(weights(t), weights(ref)) << "the rollback did not continue as a run without the spiking batches";
  // The skipped window is part of the data position: a resume after the rollback continues it.
  const TrainConfig cfg2 = f.config(sets, "ck2");
  Trainer first(cfg2, src, [&] {
    TrainerOptions x = o;
    x.stop_after_steps = 13;
    return x;
  }());
  first.run();
  Trainer second(cfg2, src, quiet("auto"));
  EXPECT_EQ(second.step(), 13);
  second.run();
  EXPECT_EQ(weights(second), weights(ref)) << "a resume after the rollback forgot the skipped batches";
}

TEST(AsyncCheckpoint, WritesWhatASynchronousSaveWritesAndResumesExactly) {
  Fixture f("async_ck");
  const std::vector<std::string> sets = {"schedule.steps=8", "schedule.eval_interval=0", "checkpoint.every_steps=2",
                                         "checkpoint.keep_last=10"};
  std::vector<std::string> async_sets = sets;
  async_sets.push_back("checkpoint.async=true");
  const TrainConfig sync_cfg = f.config(sets, "sync"), async_cfg = f.config(async_sets, "async");
  DatasetSource src(sync_cfg);
  Trainer a(sync_cfg, src, quiet());
  const TrainResult ra = a.run();
  Trainer b(async_cfg, src, quiet());
  const TrainResult rb = b.run();
  EXPECT_EQ(ra.losses, rb.losses);
  EXPECT_EQ(rb.last_checkpoint, f.dir + "/async/step_000008");
  for (const char* step : {"step_000002", "step_000004", "step_000006", "step_000008"})
    for (const char* file :
         {"model.safetensors", "optimizer.exp_avg.safetensors", "optimizer.exp_avg_sq.safetensors"}) {
      ASSERT_TRUE(verify_checkpoint(f.dir + "/async/" + step, nullptr)) << step;
      EXPECT_EQ(io::read_file(f.dir + "/sync/" + step + "/" + file),
                io::read_file(f.dir + "/async/" + step + "/" + file))
          << step << "/" << file;
    }
  EXPECT_EQ(io::read_file(f.dir + "/async/latest"), "step_000008\n");
  EXPECT_GT(rb.checkpoint_stall_s, 0);
  // Stopped after 5 steps (the step-4 write may still be running when the run ends: it completes
  // first), resumed from it: the same as the run that never stopped.
  const TrainConfig c2 = f.config(async_sets, "async2");
  {
    Trainer first(c2, src, quiet("", 5));
    first.run();
  }
  Trainer second(c2, src, quiet("auto"));
  EXPECT_EQ(second.step(), 5);
  second.run();
  EXPECT_EQ(weights(second), weights(a));
}

// The loss (as reported; gradients untouched) ten times higher from step 21 on: the smoothed loss
// passes twice its minimum at step 22 and stays there, so the run stops as diverged at step 46
// (25 steps above). Step 20 was the last healthy one: the checkpoints after it are removed, and
// the one of step 20 (keep_last 1 would have pruned it once step 24 was saved) is `latest`.
TEST(Guard, ADivergingRunStopsAndLeavesTheCheckpointFromBeforeIt) {
  Fixture f("guard_diverge");
  const std::vector<std::string> sets = {"schedule.steps=80", "schedule.eval_interval=0", "checkpoint.every_steps=4",
                                         "checkpoint.keep_last=1", "guard.spike_z=0"};
  const TrainConfig cfg = f.config(sets, "ck");
  DatasetSource src(cfg);
  TrainerOptions o = quiet();
  for (int64_t s = 21; s <= 80; ++s) o.inject_loss_factor_at.push_back({s, 10.0});
  Trainer t(cfg, src, o);
  const TrainResult r = t.run();
  EXPECT_EQ(r.ended, RunEnd::diverged);
  EXPECT_EQ(r.steps, 46);
  EXPECT_EQ(r.last_healthy_step, 20);
  EXPECT_NE(r.end_reason.find("since step 22"), std::string::npos) << r.end_reason;
  EXPECT_NE(r.end_reason.find("it began after step 20"), std::string::npos) << r.end_reason;
  EXPECT_LT(r.final_val_loss, 0);
  EXPECT_EQ(io::read_file(f.dir + "/ck/latest"), "step_000020\n");
  EXPECT_EQ(r.last_checkpoint, f.dir + "/ck/step_000020");
  std::vector<int64_t> held;
  for (const CheckpointEntry& e : list_checkpoints(f.dir + "/ck")) held.push_back(e.step);
  EXPECT_EQ(held, std::vector<int64_t>{20}) << "the diverging checkpoints (24-44) were kept, or 20 pruned";
  // guard.divergence=warn: the same run says so once and goes on to the end.
  std::vector<std::string> warn_sets = sets;
  warn_sets.push_back("guard.divergence=warn");
  const TrainConfig warn = f.config(warn_sets, "ck_warn");
  Trainer w(warn, src, o);
  const TrainResult rw = w.run();
  EXPECT_EQ(rw.ended, RunEnd::finished);
  EXPECT_EQ(rw.steps, 80);
  EXPECT_EQ(rw.divergence_warnings, 1);
}

// Without checkpoint.dir a spike is counted, nothing rolled back; the run goes on unchanged.
TEST(Guard, SpikesWithoutCheckpointsAreCountedNotRolledBack) {
  Fixture f("guard_spike_count");
  const TrainConfig cfg = f.config({"schedule.steps=16", "schedule.eval_interval=0", "guard.spike_window=8"});
  EXPECT_EQ(cfg.guard.spike_z, kDefaultSpikeZ) << "the spike guard is not on by default";
  DatasetSource src(cfg);
  Trainer plain(cfg, src, quiet());
  const TrainResult rp = plain.run();
  EXPECT_EQ(rp.spikes, 0) << "a healthy run spiked";
  TrainerOptions o = quiet();
  o.inject_loss_factor_at = {{10, 100.0}, {11, 100.0}, {12, 100.0}, {13, 100.0}};
  Trainer t(cfg, src, o);
  const TrainResult r = t.run();
  EXPECT_EQ(r.ended, RunEnd::finished);
  EXPECT_EQ(r.spikes, 3) << "after guard.max_spikes=3 in a row the window starts again (step 13 joins it)";
  EXPECT_EQ(r.rollbacks, 0);
  EXPECT_EQ(weights(t), weights(plain)) << "a counted spike changed the training";
}

// A loss that spikes again after every rollback to the same checkpoint (whatever batches come
// next): the third time the run stops as diverged instead of skipping batches until they run out.
TEST(Guard, SpikingAgainAfterTwoRollbacksToTheSameCheckpointIsADivergence) {
  Fixture f("guard_spike_again");
  const TrainConfig cfg =
      f.config({"schedule.steps=40", "schedule.eval_interval=0", "checkpoint.every_steps=8", "checkpoint.keep_last=5",
                "guard.spike_z=4", "guard.spike_window=8", "guard.max_spikes=2"},
               "ck");
  DatasetSource src(cfg);
  TrainerOptions o = quiet();
  for (int64_t b = 10; b <= 60; ++b) o.inject_loss_factor_at.push_back({b, 100.0});  // every batch from 10 on
  Trainer t(cfg, src, o);
  const TrainResult r = t.run();
  EXPECT_EQ(r.ended, RunEnd::diverged);
  EXPECT_EQ(r.rollbacks, 2);
  EXPECT_NE(r.end_reason.find("after each of two rollbacks to step_000008"), std::string::npos) << r.end_reason;
  EXPECT_EQ(io::read_file(f.dir + "/ck/latest"), "step_000008\n");
}
