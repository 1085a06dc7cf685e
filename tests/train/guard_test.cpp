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
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t G, int64_t T, int32_t* tok, int32_t* tgt) override {
    in_.fill_train(step >= from_ ? step + shift_ : step, first, n, G, T, tok, tgt);
  }
  void fill_val(int64_t i, int64_t B, int64_t T, int32_t* tok, int32_t* tgt) override {
    in_.fill_val(i, B, T, tok, tgt);
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
  try {
    Trainer t(stop_cfg, src, o);
    t.run();
    FAIL() << "guard.nonfinite=stop did not stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss is nan at step 3"), std::string::npos) << e.what();
  }
  // More non-finite steps in a row than guard.max_consecutive_skips stop the run.
  const TrainConfig two_max =
      f.config({"schedule.steps=6", "schedule.eval_interval=0", "guard.max_consecutive_skips=2"});
  o.stop_after_steps = -1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  o.inject_loss_factor_at = {{2, nan}, {3, nan}, {4, nan}};
  try {
    Trainer t(two_max, src, o);
    t.run();
    FAIL() << "3 non-finite steps in a row went on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 steps in a row"), std::string::npos) << e.what();
  }
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
