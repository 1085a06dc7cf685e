// The trainer end to end on a tiny model and a slice of Tiny Shakespeare: learning, exact
// resume, corrupted and truncated checkpoints, and the demo config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/io/safetensors.h"
#include "loom/train/checkpoint.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;
namespace fs = std::filesystem;

using loom::testing::quiet;

TEST(Trainer, TinyModelLearnsShakespeareBytes) {
  const std::string dir = loom::testing::temp_dir("learn");
  const std::string data = loom::testing::prepare_shakespeare(dir);
  TrainConfig cfg = parse_train_config(loom::testing::tiny_config_yaml(data, ""),
                                       {"schedule.steps=150", "optim.lr=1e-2", "model.d_model=64", "model.d_ff=256"});
  DatasetSource src(cfg);
  Trainer t(cfg, src, quiet());
  TrainResult r = t.run();
  ASSERT_EQ(r.losses.size(), 150u);
  // Uniform over 256 bytes is ln 256 = 5.55 nats; the unigram baseline is about 3.3.
  EXPECT_GT(r.losses.front(), 5.0);
  EXPECT_LT(r.losses.back(), 3.2) << "150 steps should take the loss from ln 256 = 5.55 to under 3.2";
  EXPECT_GT(r.final_val_loss, 0);
  EXPECT_LT(r.final_val_loss, 3.3);  // below the unigram baseline
}

// 12 steps straight against 6, save, resume, 6: the same losses, weights and moments bitwise.
void expect_exact_resume(const std::string& name, std::vector<std::string> sets) {
  const std::string dir = loom::testing::temp_dir(name);
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  const std::string yaml = loom::testing::tiny_config_yaml(data, dir + "/ck");
  sets.push_back("schedule.steps=12");
  TrainConfig cfg = parse_train_config(yaml, sets);
  DatasetSource src(cfg);
  // 12 steps in one go.
  TrainConfig straight_cfg = cfg;
  straight_cfg.checkpoint.dir = dir + "/ck_straight";
  Trainer straight(straight_cfg, src, quiet());
  TrainResult a = straight.run();
  // 6 steps, save, then resume and run the other 6.
  {
    Trainer first(cfg, src, quiet("", 6));
    TrainResult r = first.run();
    ASSERT_EQ(r.steps, 6);
    ASSERT_FALSE(r.last_checkpoint.empty());
  }
  Trainer second(cfg, src, quiet("auto"));
  ASSERT_EQ(second.step(), 6);
  TrainResult b = second.run();
  ASSERT_EQ(b.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(a.losses[6 + i], b.losses[i]) << "step " << 7 + i;
  const Tensor& pa = straight.model().params();
  const Tensor& pb = second.model().params();
  ASSERT_EQ(pa.nbytes(), pb.nbytes());
  EXPECT_EQ(0, std::memcmp(pa.raw(), pb.raw(), pa.nbytes())) << "final weights differ bitwise";
  for (size_t u = 0; u < straight.data_parallel().optimizers().size(); ++u) {
    const Tensor& va = straight.data_parallel().optimizers()[u]->exp_avg_sq();
    const Tensor& vb = second.data_parallel().optimizers()[u]->exp_avg_sq();
    EXPECT_EQ(0, std::memcmp(va.raw(), vb.raw(), va.nbytes())) << "optimizer unit " << u;
  }
  const Tensor& ba = straight.model().router_bias();
  if (ba.defined()) {
    const Tensor& bb = second.model().router_bias();
    EXPECT_EQ(0, std::memcmp(ba.raw(), bb.raw(), ba.nbytes())) << "MoE balancing biases differ";
    bool moved = false;
    for (int64_t i = 0; i < ba.numel(); ++i) moved = moved || ba.data<float>()[i] != 0.0f;
    EXPECT_TRUE(moved) << "the balancing bias never moved";
  }
}

TEST(Trainer, ResumeIsExact) { expect_exact_resume("resume", {}); }

TEST(Trainer, MoeResumeIsExactWithItsBalancingBias) {
  expect_exact_resume("resume_moe", {"model.preset=llama-moe-tiny", "model.vocab_size=256", "model.n_ctx=32",
                                     "model.moe.bias_update_rate=0.01", "model.moe.capacity_factor=1.25",
                                     "model.moe.router_z_loss_coef=0.001"});
}

// One config file serves a MoE model and its dense peer (model.preset=llama-60m on
// configs/llama-moe-60m-shakespeare.yaml): a dense model ignores the model.moe keys.
TEST(Trainer, DenseModelIgnoresTheMoeKeys) {
  const std::string dir = loom::testing::temp_dir("dense_moe_keys");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  TrainConfig cfg = parse_train_config(loom::testing::tiny_config_yaml(data, ""),
                                       {"schedule.steps=3", "model.moe.bias_update_rate=0.01",
                                        "model.moe.capacity_factor=1.25", "model.moe.first_dense=1"});
  ASSERT_FALSE(cfg.model.moe.enabled());
  DatasetSource src(cfg);
  Trainer t(cfg, src, quiet());
  TrainResult r = t.run();
  EXPECT_EQ(r.losses.size(), 3u);
  EXPECT_FALSE(t.model().router_bias().defined());
}

TEST(Checkpoint, CorruptedAndTruncatedCheckpointsAreSkipped) {
  const std::string dir = loom::testing::temp_dir("corrupt");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  TrainConfig cfg = parse_train_config(loom::testing::tiny_config_yaml(data, dir + "/ck"),
                                       {"schedule.steps=6", "checkpoint.every_steps=2"});
  DatasetSource src(cfg);
  Trainer(cfg, src, quiet()).run();
  const std::string ck = dir + "/ck";
  ASSERT_TRUE(fs::exists(ck + "/step_000006/manifest.json"));
  ASSERT_TRUE(fs::exists(ck + "/step_000004"));
  ASSERT_EQ(io::read_file(ck + "/latest"), "step_000006\n");
  ASSERT_TRUE(loom::testing::flip_byte(ck + "/step_000006/model.safetensors", 200, 0x40));  // newest weights
  char buf[4096] = {};
  FILE* log = fmemopen(buf, sizeof buf, "w");
  auto found = find_latest_valid_checkpoint(ck, log);
  std::fclose(log);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::path(*found).filename(), "step_000004");
  EXPECT_NE(std::string(buf).find("step_000006: model.safetensors checksum"), std::string::npos) << buf;
  // Truncate the next one: skipped too, in favour of step 2.
  fs::resize_file(ck + "/step_000004/optimizer.exp_avg.safetensors", 100);
  std::string why;
  EXPECT_FALSE(verify_checkpoint(ck + "/step_000004", &why));
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  found = find_latest_valid_checkpoint(ck, nullptr);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::path(*found).filename(), "step_000002");
  // Resuming "auto" lands on step 2.
  Trainer t(cfg, src, quiet("auto"));
  EXPECT_EQ(t.step(), 2);
  // Corrupt Adam moments (size unchanged) fail a full or a resuming rank's verification, but not
  // a weights-only one: generate and serve neither read nor checksum them.
  ASSERT_TRUE(loom::testing::flip_byte(ck + "/step_000002/optimizer.exp_avg_sq.safetensors", 150, 0x01));
  EXPECT_FALSE(verify_checkpoint(ck + "/step_000002", &why));
  EXPECT_NE(why.find("optimizer.exp_avg_sq.safetensors checksum"), std::string::npos) << why;
  EXPECT_FALSE(verify_checkpoint(ck + "/step_000002", nullptr, VerifyScope::rank(0)));
  EXPECT_FALSE(verify_checkpoint(ck + "/step_000002", nullptr, VerifyScope::rank(1)));
  EXPECT_TRUE(verify_checkpoint(ck + "/step_000002", nullptr, VerifyScope::weights()));
  EXPECT_EQ(model::resolve_checkpoint(ck + "/step_000002"), ck + "/step_000002");
  EXPECT_EQ(load_checkpoint_weights(ck + "/step_000002", t.model()).step, 2);
  // Loading the corrupt one directly is refused with the reason.
  try {
    load_checkpoint_weights(ck + "/step_000006", t.model());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed verification"), std::string::npos);
  }
}

// A NaN weight makes every step's loss NaN: guard.nonfinite=stop stops at the first, naming it;
// the default (skip) skips guard.max_consecutive_skips steps, then stops naming the last. The run
// ends as "nonfinite" (loom train's divergence status), not with an exception.
TEST(Trainer, NonFiniteLossStopsNamingTheStep) {
  const std::string dir = loom::testing::temp_dir("nan");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  for (const bool stop : {true, false}) {
    TrainConfig cfg =
        parse_train_config(loom::testing::tiny_config_yaml(data, ""),
                           {"schedule.steps=20", stop ? "guard.nonfinite=stop" : "guard.max_consecutive_skips=10"});
    DatasetSource src(cfg);
    Trainer t(cfg, src, quiet());
    t.model().params().data<float>()[5] = NAN;
    const TrainResult r = t.run();
    EXPECT_EQ(r.ended, RunEnd::nonfinite)
        << "a run whose every loss is NaN went on (guard.nonfinite=" << nonfinite_name(cfg.guard.nonfinite) << ")";
    EXPECT_EQ(r.steps, stop ? 1 : 11);
    const std::string want = stop ? "loss is nan at step 1"
                                  : "11 steps in a row had a non-finite loss or gradient norm (the last at step 11";
    EXPECT_NE(r.end_reason.find(want), std::string::npos) << r.end_reason;
    EXPECT_EQ(r.last_healthy_step, 0);
    EXPECT_LT(r.final_val_loss, 0) << "a stopped run was evaluated";
  }
}

TEST(Trainer, DemoConfigRunsAFewSteps) {
  const std::string dir = loom::testing::temp_dir("demo");
  const std::string data = loom::testing::prepare_shakespeare(dir, 100000);
  TrainConfig cfg =
      load_train_config(std::string(LOOM_SOURCE_DIR) + "/configs/shakespeare.yaml",
                        {"data.dir=" + data, "schedule.steps=3", "checkpoint.dir=" + dir + "/ck",
                         "log.metrics_path=" + dir + "/metrics.jsonl", "schedule.eval_batches=2", "data.batch_size=8"});
  DatasetSource src(cfg);
  Trainer t(cfg, src, quiet());
  TrainResult r = t.run();
  EXPECT_EQ(r.steps, 3);
  EXPECT_TRUE(std::isfinite(r.final_train_loss));
  EXPECT_TRUE(fs::exists(dir + "/ck/step_000003/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/metrics.jsonl"));
}

// fp16 with dynamic loss scaling: an injected overflow skips the update (the weights after the
// skipped step equal those before it) and halves the scale; `window` clean steps double it; a
// resume continues the scale and the run bitwise; the fp16 run learns like the f32 one.
TEST(Trainer, Fp16LossScaleSkipsOverflowsHalvesAndGrowsAndResumesExactly) {
  const std::string dir = loom::testing::temp_dir("fp16");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  const std::string yaml = loom::testing::tiny_config_yaml(data, dir + "/ck");
  TrainConfig cfg = parse_train_config(yaml, {"schedule.steps=10", "model.precision=fp16",
                                              "optim.loss_scale_initial=1024", "optim.loss_scale_window=3"});
  DatasetSource src(cfg);
  TrainerOptions o = quiet();
  o.inject_grad_overflow_at = {3, 4};
  TrainConfig straight_cfg = cfg;
  straight_cfg.checkpoint.dir = dir + "/ck_straight";
  Trainer straight(straight_cfg, src, o);
  const TrainResult a = straight.run();
  EXPECT_EQ(a.skipped_steps, 2);
  // Steps 1-2 at 1024; 3 overflows (-> 512); 4 overflows (-> 256); 5-7 clean (-> 512); 8-10.
  const std::vector<double> want = {1024, 1024, 1024, 512, 256, 256, 256, 512, 512, 512};
  EXPECT_EQ(a.loss_scales, want);

  // The skipped update leaves the weights as they were: 3 steps with step 3 overflowing equal 2.
  TrainConfig short_cfg = cfg;
  short_cfg.checkpoint.dir = "";
  short_cfg.schedule.steps = 10;
  TrainerOptions two = quiet("", 2), three = quiet("", 3);
  three.inject_grad_overflow_at = {3};
  Trainer t2(short_cfg, src, two), t3(short_cfg, src, three);
  t2.run();
  t3.run();
  EXPECT_EQ(0, std::memcmp(t2.model().params().raw(), t3.model().params().raw(), t2.model().params().nbytes()))
      << "the overflowing step changed the weights";

  // Resume after the scale moved: 5 steps, save, resume for the other 5, bitwise the same.
  {
    TrainerOptions first = o;
    first.stop_after_steps = 5;
    Trainer t(cfg, src, first);
    t.run();
  }
  TrainerOptions rest = o;
  rest.resume = "auto";
  Trainer second(cfg, src, rest);
  ASSERT_EQ(second.step(), 5);
  const TrainResult b = second.run();
  ASSERT_EQ(b.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(a.losses[5 + i], b.losses[i]) << "step " << 6 + i;
    EXPECT_EQ(a.loss_scales[5 + i], b.loss_scales[i]) << "scale at step " << 6 + i;
  }
  EXPECT_EQ(0, std::memcmp(straight.model().params().raw(), second.model().params().raw(),
                           straight.model().params().nbytes()))
      << "final weights differ bitwise after resume";
}

TEST(Trainer, Fp16Learns) {
  const std::string dir = loom::testing::temp_dir("fp16learn");
  const std::string data = loom::testing::prepare_shakespeare(dir);
  auto run = [&](const std::string& precision, int64_t steps) {
    TrainConfig cfg = parse_train_config(loom::testing::tiny_config_yaml(data, ""),
                                         {"schedule.steps=" + std::to_string(steps), "schedule.eval_batches=8",
                                          "model.d_model=64", "model.d_ff=256", "model.precision=" + precision});
    DatasetSource src(cfg);
    Trainer t(cfg, src, quiet());
    return t.run();
  };
  const TrainResult f32 = run("fp32", 150), f16 = run("fp16", 150);
  // The scale starts at 2^16 and halves at each overflow, so a step may be skipped while it
  // settles; whether one is depends on the BLAS kernels' rounding (none on a Sapphire Rapids
  // class Xeon, one on Zen 4). More would mean the scaler misbehaves.
  EXPECT_LE(f16.skipped_steps, 2);
  EXPECT_NE(f16.final_val_loss, f32.final_val_loss);  // the products were rounded
  // Measured at lr 3e-3 (the config's), 150 steps: fp16 0.5-0.7% from f32 (2 and 8 evaluation
  // batches), bf16, whose rounding is 8 times coarser, 2.4-3.6%. The bound of 3% is 4 times
  // fp16's spread; a run that learned a third less (f32 stopped at 100 steps) is 10-11% above
  // and must break it. (At lr 1e-2 the runs were chaotic: bf16 8.5% off, hence the old 10%.)
  const double bound = 0.03 * f32.final_val_loss;
  EXPECT_NEAR(f16.final_val_loss, f32.final_val_loss, bound);
  const TrainResult shorter = run("fp32", 100);
  EXPECT_GT(shorter.final_val_loss - f32.final_val_loss, bound) << "the bound passes a run of 2/3 the steps";
}

// A format-1 checkpoint (each rank's Adam moments in its optimizer.rank<r> shard, written before
// the moments became layout-independent) still resumes on the layout that saved it, with its
// moments; another layout is refused, naming both and what to do.
TEST(Checkpoint, Format1CheckpointsResumeOnTheirOwnLayout) {
  const std::string dir = loom::testing::temp_dir("format1");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  TrainConfig cfg = parse_train_config(loom::testing::tiny_config_yaml(data, dir + "/ck"), {"schedule.steps=4"});
  DatasetSource src(cfg);
  Trainer a(cfg, src, quiet());
  a.run();
  // Rewrite step 4 as format 1 would have written it.
  const std::string ck = dir + "/ck/step_000004";
  io::SafetensorsWriter w;
  const auto& units = a.model().layout().units();
  for (size_t i = 0; i < units.size(); ++i) {
    w.add(units[i].name + ".exp_avg", a.data_parallel().optimizers()[i]->exp_avg());
    w.add(units[i].name + ".exp_avg_sq", a.data_parallel().optimizers()[i]->exp_avg_sq());
  }
  w.write(ck + "/optimizer.rank00000.safetensors");
  fs::remove(ck + "/optimizer.exp_avg.safetensors");
  fs::remove(ck + "/optimizer.exp_avg_sq.safetensors");
  io::ManifestWriter m(ck);
  for (const char* f :
       {"model.safetensors", "config.json", "optimizer.rank00000.safetensors", "trainer_state.json", "config.yaml"})
    m.record(f);
  m.write(io::kTrainingCheckpointFormat, 1);
  ASSERT_TRUE(verify_checkpoint(ck, nullptr));
  Trainer b(cfg, src, quiet(ck));
  EXPECT_EQ(b.step(), 4);
  EXPECT_EQ(b.model().params().to_f32_vector(), a.model().params().to_f32_vector());
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(b.data_parallel().optimizers()[i]->exp_avg().to_f32_vector(),
              a.data_parallel().optimizers()[i]->exp_avg().to_f32_vector());
    EXPECT_EQ(b.data_parallel().optimizers()[i]->exp_avg_sq().to_f32_vector(),
              a.data_parallel().optimizers()[i]->exp_avg_sq().to_f32_vector());
    EXPECT_EQ(b.data_parallel().optimizers()[i]->step_count(), 4);
  }
  TrainConfig other = cfg;
  other.parallel.zero_stage = 1;
  try {
    Trainer c(other, src, quiet(ck));
    FAIL() << "a format-1 checkpoint resumed on another layout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("format-1 checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zero_stage=1"), std::string::npos) << e.what();
  }
}
