// A checkpoint directory across runs: pruning keeps what the run needs and never another run's
// or newer checkpoints, a new run refuses a directory holding checkpoints (or overwrites them
// when told), resume follows `latest` and names the run, the metrics file after a resume, and
// the up-front memory check.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_dir.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "testing/errors.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;
namespace fs = std::filesystem;
using loom::testing::error_of;

namespace {

struct Log {
  char buf[16384] = {};
  FILE* f = fmemopen(buf, sizeof buf, "w");
  ~Log() { std::fclose(f); }
  std::string text() {
    std::fflush(f);
    return buf;
  }
};

TrainerOptions options(FILE* log, const std::string& resume = "", int64_t stop = -1, bool overwrite = false) {
  TrainerOptions o;
  o.resume = resume;
  o.stop_after_steps = stop;
  o.overwrite_checkpoints = overwrite;
  o.log = log;
  return o;
}

// A temporary directory with a prepared slice of Tiny Shakespeare; checkpoint.dir is DIR/ck.
struct Workspace {
  std::string dir, data, ck;
  explicit Workspace(const std::string& name)
      : dir(loom::testing::temp_dir(name)), data(loom::testing::prepare_shakespeare(dir, 20000)), ck(dir + "/ck") {}
  TrainConfig config(const std::vector<std::string>& sets, bool checkpoints = true) const {
    return parse_train_config(loom::testing::tiny_config_yaml(data, checkpoints ? ck : ""), sets);
  }
};

std::vector<int64_t> steps_in(const std::string& dir) {
  std::vector<int64_t> out;
  for (const auto& e : list_checkpoints(dir)) out.push_back(e.step);
  return out;
}

}  // namespace

TEST(CheckpointDir, PruningKeepsTheRunsNewestAndNothingNewerAndResumeFollowsLatest) {
  const Workspace w("prune");
  const std::string& ck = w.ck;
  Log log;
  TrainConfig a_cfg = w.config({"schedule.steps=10", "checkpoint.every_steps=5"});
  DatasetSource src(a_cfg);
  Trainer(a_cfg, src, options(log.f)).run();
  ASSERT_EQ(steps_in(ck), (std::vector<int64_t>{10, 5}));
  const std::string run = checkpoint_run_id(ck + "/step_000010");
  ASSERT_EQ(run.size(), 16u);
  EXPECT_EQ(checkpoint_run_id(ck + "/step_000005"), run);

  // Back to step 5 and on with checkpoints every 2 steps, keeping 1: steps 6 and 8 are saved.
  TrainConfig b_cfg = w.config({"schedule.steps=10", "checkpoint.every_steps=2", "checkpoint.keep_last=1"});
  {
    Trainer b(b_cfg, src, options(log.f, ck + "/step_000005", 8));
    b.run();
  }
  // Step 8 (this run's newest) stays; 10 is newer than what the run keeps, so it stays too;
  // the run's older 5 and 6 go. Pruning by step number alone deleted 8 right after saving it.
  EXPECT_EQ(steps_in(ck), (std::vector<int64_t>{10, 8}));
  EXPECT_EQ(io::read_file(ck + "/latest"), "step_000008\n");
  EXPECT_EQ(checkpoint_run_id(ck + "/step_000008"), run) << "a resume continues its run";
  EXPECT_NE(log.text().find("[resume] resumed run " + run + " from " + ck + "/step_000005 at step 5"),
            std::string::npos)
      << log.text();
  // --resume auto continues from what was saved last, not from the abandoned step 10.
  Trainer c(b_cfg, src, options(log.f, "auto"));
  EXPECT_EQ(c.step(), 8);
  // A damaged `latest` target falls back to the highest valid step.
  ASSERT_TRUE(loom::testing::flip_byte(ck + "/step_000008/model.safetensors", 300, 0x10));
  Trainer d(b_cfg, src, options(log.f, "auto"));
  EXPECT_EQ(d.step(), 10);
}

TEST(CheckpointDir, PruneNeverTouchesAnotherRunsCheckpoints) {
  const Workspace w("prune_other");
  const std::string& ck = w.ck;
  Log log;
  TrainConfig cfg = w.config({"schedule.steps=4", "checkpoint.every_steps=2"});
  DatasetSource src(cfg);
  Trainer(cfg, src, options(log.f)).run();
  ASSERT_EQ(steps_in(ck), (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(prune_checkpoints(ck, "0123456789abcdef", 3, 1).empty());
  EXPECT_TRUE(prune_checkpoints(ck, "", 4, 1).empty());
  EXPECT_EQ(prune_checkpoints(ck, checkpoint_run_id(ck + "/step_000004"), 4, 1),
            (std::vector<std::string>{ck + "/step_000002"}));
}

TEST(CheckpointDir, NewRunRefusesADirectoryHoldingCheckpointsUnlessTold) {
  const Workspace w("claim");
  const std::string& ck = w.ck;
  Log log;
  TrainConfig cfg = w.config({"schedule.steps=4", "checkpoint.every_steps=2"});
  DatasetSource src(cfg);
  Trainer(cfg, src, options(log.f)).run();
  const std::string old_run = checkpoint_run_id(ck + "/step_000004");
  // A new run from step 0 into that directory: refused before any step, nothing touched.
  std::string e = error_of([&] { Trainer(cfg, src, options(log.f)); });
  EXPECT_NE(e.find("[checkpoint] checkpoint.dir=" + ck + " already holds 2 checkpoints (newest: step_000004 of run " +
                   old_run + ")"),
            std::string::npos)
      << e;
  for (const char* fix : {"--resume auto", "another checkpoint.dir", "--overwrite-checkpoints"})
    EXPECT_NE(e.find(fix), std::string::npos) << e;
  EXPECT_EQ(steps_in(ck), (std::vector<int64_t>{4, 2}));
  // --resume auto with no valid checkpoint left would start at step 0: refused the same way.
  for (const char* s : {"/step_000004/model.safetensors", "/step_000002/model.safetensors"})
    ASSERT_TRUE(loom::testing::flip_byte(ck + s, 300, 0x10));
  e = error_of([&] { Trainer(cfg, src, options(log.f, "auto")); });
  EXPECT_NE(e.find("already holds 2 checkpoints"), std::string::npos) << e;
  // Told to overwrite: the old run's checkpoints go, the new run's are all that is left.
  TrainConfig two = cfg;
  two.schedule.steps = 2;
  Trainer t(two, src, options(log.f, "", -1, /*overwrite=*/true));
  t.run();
  EXPECT_EQ(steps_in(ck), (std::vector<int64_t>{2}));
  const std::string new_run = checkpoint_run_id(ck + "/step_000002");
  EXPECT_EQ(new_run.size(), 16u);
  EXPECT_NE(new_run, old_run);
  EXPECT_NE(log.text().find("--overwrite-checkpoints: removed"), std::string::npos);
}

TEST(CheckpointDir, MetricsAfterAResumeHoldEachStepOnceAndMarkTheResume) {
  const Workspace w("metrics");
  const std::string& ck = w.ck;
  const std::string metrics = w.dir + "/logs/not/yet/metrics.jsonl";  // directories created on open
  Log log;
  TrainConfig cfg =
      w.config({"schedule.steps=6", "checkpoint.every_steps=3", "log.every=1", "log.metrics_path=" + metrics});
  DatasetSource src(cfg);
  Trainer(cfg, src, options(log.f, "", 5)).run();  // logs steps 1-5 and its final val loss, saves 3 and 5
  fs::remove_all(ck + "/step_000005");             // as if the run died before saving step 5
  {
    Trainer t(cfg, src, options(log.f, "auto"));
    ASSERT_EQ(t.step(), 3);
    t.run();  // replays 4 and 5, then 6
  }
  std::map<int64_t, int> count;
  int markers = 0, ends = 0;
  std::vector<std::pair<int64_t, bool>> starts;
  std::istringstream in(io::read_file(metrics));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "resume") {
      ++markers;
      EXPECT_EQ(j["step"], 3);
      EXPECT_EQ(j["dropped_lines"], 4);  // steps 4 and 5, the stopped run's final val loss and end
      EXPECT_EQ(j["run_id"], checkpoint_run_id(ck + "/step_000003"));
      continue;
    }
    if (j.value("event", "") == "run_start") {  // one per process, the resumed one at its step
      starts.push_back({j["step"].get<int64_t>(), j["resumed"].get<bool>()});
      continue;
    }
    if (j.value("event", "") == "end") {  // the last line, of the run that reached step 6
      ++ends;
      EXPECT_EQ(j["step"], 6);
      EXPECT_EQ(j["ended"], "finished");
      continue;
    }
    if (j.contains("val_loss")) {  // the final evaluation, after step 6 only
      EXPECT_EQ(j["step"], 6);
      EXPECT_EQ(j["final"], true);
      continue;
    }
    ++count[j["step"].get<int64_t>()];
  }
  EXPECT_EQ(markers, 1);
  EXPECT_EQ(ends, 1);
  EXPECT_EQ(starts, (std::vector<std::pair<int64_t, bool>>{{0, false}, {3, true}}));
  EXPECT_EQ(count, (std::map<int64_t, int>{{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}}));
}

TEST(CheckpointDir, AMicroBatchBeyondMemoryIsRefusedUpFront) {
  const Workspace w("oom");
  Log log;
  TrainConfig cfg = w.config({"data.batch_size=1000000000000000", "data.micro_batch_size=0"}, /*checkpoints=*/false);
  DatasetSource src(cfg);
  const std::string e = error_of([&] { Trainer(cfg, src, options(log.f)); });
  EXPECT_NE(e.find("[train] micro-batches of 1000000000000000 sequences"), std::string::npos) << e;
  EXPECT_NE(e.find("more than this machine's"), std::string::npos) << e;
  EXPECT_NE(e.find("lower data.micro_batch_size"), std::string::npos) << e;
}
