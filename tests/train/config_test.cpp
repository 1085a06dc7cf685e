// Every config error path names the key path and the problem before any work starts.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "loom/core/error.h"
#include "loom/optim/schedule.h"
#include "loom/train/train_config.h"

using namespace loom;
using namespace loom::train;

namespace {
const char* kBase = "model:\n  preset: gpt2-tiny\ndata:\n  dir: /tmp/x\n  batch_size: 8\n";

std::string error_of(const std::string& yaml, std::vector<std::string> sets = {}) {
  try {
    parse_train_config(yaml, sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
void expect_error(const std::string& yaml, const std::string& want, std::vector<std::string> sets = {}) {
  const std::string e = error_of(yaml, sets);
  EXPECT_NE(e.find(want), std::string::npos) << "got: " << e << "\nwanted: " << want;
  EXPECT_EQ(e.rfind("[config]", 0), 0u) << e;
}
}  // namespace

TEST(TrainConfig, DefaultsAndOverrides) {
  TrainConfig c = parse_train_config(kBase, {"optim.lr=3e-4", "schedule.steps=50", "parallel.dp=2"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.schedule.steps, 50);
  EXPECT_EQ(c.data.micro_batch_size, 4);  // per-rank batch when unset
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_NE(c.resolved_yaml.find("3e-4"), std::string::npos);
}

TEST(TrainConfig, WrongTypesNameTheKeyPath) {
  expect_error(kBase, "[config] optim.lr: expected a number, got \"fast\"", {"optim.lr=fast"});
  expect_error(kBase, "schedule.steps: expected an integer, got \"1.5\"", {"schedule.steps=1.5"});
  expect_error(kBase, "schedule.clip.dynamic: expected true or false", {"schedule.clip.dynamic=maybe"});
  expect_error(kBase, "parallel.pp_schedule: \"zigzag\" is not one of: gpipe, 1f1b", {"parallel.pp_schedule=zigzag"});
  expect_error(kBase, "model.d_model: expected an integer, got \"a mapping\"", {"model.d_model.x=1"});
}

TEST(TrainConfig, UnknownKeysAndRangesAreRejected) {
  expect_error(kBase, "optim.learning_rate: unknown key (known keys here: ", {"optim.learning_rate=1"});
  expect_error(std::string(kBase) + "trainer:\n  x: 1\n", "trainer: unknown key");
  expect_error(kBase, "optim.lr: -1 is out of range", {"optim.lr=-1"});
  expect_error(kBase, "parallel.zero_stage: 4 is out of range [0, 3]", {"parallel.zero_stage=4"});
  expect_error(kBase, "data.seq_len: 65 is out of range [1, 64]", {"data.seq_len=65"});
}

// Nine nested levels of ten aliases would be 10^9 nodes to walk: refused at the first alias,
// with its line, in well under a second.
TEST(TrainConfig, YamlAliasesAreRefusedWithTheirLine) {
  std::string bomb = std::string(kBase) + "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int k = 1; k <= 9; ++k) {
    bomb += "x" + std::to_string(k) + ": &a" + std::to_string(k) + " [";
    for (int j = 0; j < 10; ++j) bomb += std::string(j ? ", " : "") + "*a" + std::to_string(k - 1);
    bomb += "]\n";
  }
  expect_error(bomb, "[config] <string>:7: YAML aliases (*name) are not accepted");
  expect_error(std::string(kBase) + "optim: &o\n  lr: 1e-3\nschedule: *o\n", ":8: YAML aliases");
  EXPECT_EQ(error_of(std::string(kBase) + "optim: &o\n  lr: 1e-3\n"), "");  // an anchor alone is harmless
  // A lone "," is an empty document to YAML::Load, and one yaml-cpp's event parser hands out
  // again and again: the alias check reads the first document only.
  expect_error(",", "data.dir: required");
}

TEST(TrainConfig, WireDtypesAreNamedOrRefused) {
  EXPECT_EQ(wire_dtype("bf16"), DType::bf16);
  EXPECT_EQ(wire_dtype("fp16"), DType::f16);
  EXPECT_EQ(wire_dtype("fp32"), DType::f32);
  EXPECT_THROW(wire_dtype("fp8"), Error);  // not fp32 by default
}

TEST(TrainConfig, CrossFieldChecks) {
  expect_error("model:\n  preset: gpt2-tiny\n", "data.dir: required");
  expect_error(kBase, "data.batch_size=8 is not divisible by parallel.dp=3", {"parallel.dp=3"});
  expect_error(kBase, "data.micro_batch_size=3 does not divide the per-rank batch 8", {"data.micro_batch_size=3"});
  expect_error(kBase, "model.n_head=5 does not divide model.d_model=32", {"model.n_head=5"});
  expect_error(kBase, "schedule.min_lr=0.1 exceeds optim.lr=0.01", {"optim.lr=0.01", "schedule.min_lr=0.1"});
  expect_error(kBase, "checkpoint.dir: required when", {"checkpoint.every_steps=10"});
  expect_error(kBase, "--set expects key=value", {"optim.lr"});
  expect_error("a: [1, 2", "not valid YAML");
}

// parallel.offload.*: the target by name, the stages as auto or a list of pipeline stages.
TEST(TrainConfig, OffloadKeys) {
  TrainConfig c = parse_train_config(kBase, {"parallel.pp=2", "parallel.offload.optimizer=disk",
                                             "parallel.offload.stages=[0]", "parallel.memory_limit_mb=512"});
  EXPECT_EQ(c.parallel.offload, optim::OffloadTarget::disk);
  EXPECT_EQ(c.parallel.offload_stages, std::vector<int64_t>{0});
  EXPECT_EQ(c.parallel.memory_limit_mb, 512);
  c = parse_train_config(kBase, {"parallel.offload.optimizer=host"});
  EXPECT_TRUE(c.parallel.offload_stages.empty());  // auto
  expect_error(kBase, "parallel.offload.optimizer: \"ssd\" is not one of: none, host, disk",
               {"parallel.offload.optimizer=ssd"});
  expect_error(kBase, "parallel.offload.stages: \"2\" is not a pipeline stage (0 to parallel.pp - 1 = 1) nor auto",
               {"parallel.pp=2", "parallel.offload.stages=0,2"});
  expect_error(kBase, "parallel.offload.optimizer=host with optim.name=onebit_adam is not supported",
               {"parallel.offload.optimizer=host", "optim.name=onebit_adam"});
}

// Unset, schedule.warmup_steps resolves to min(10000, 10% of schedule.steps): 100 of 1,000
// steps, and 10,000 (not 100,000) of 1,000,000, with the learning rate reaching its peak at the
// warmup's last step. The schedule is built from the config as the trainer builds it.
TEST(LrSchedule, DefaultWarmupIsTenPercentCappedAtTenThousand) {
  for (const auto& [steps, warmup] : {std::pair<int64_t, int64_t>{1000, 100}, {1000000, 10000}}) {
    const TrainConfig c = parse_train_config(kBase, {"schedule.steps=" + std::to_string(steps), "optim.lr=1e-3"});
    EXPECT_EQ(c.schedule.warmup_steps, -1);
    const optim::LrSchedule sched{c.optim.lr, c.schedule.min_lr, c.schedule.warmup_steps, c.schedule.steps};
    EXPECT_EQ(sched.resolved_warmup(), warmup) << steps << " steps";
    EXPECT_DOUBLE_EQ(sched.lr_at(0), 1e-3 / double(warmup)) << steps << " steps";
    EXPECT_DOUBLE_EQ(sched.lr_at(warmup / 2 - 1), 0.5e-3) << steps << " steps";
    EXPECT_DOUBLE_EQ(sched.lr_at(warmup - 1), 1e-3) << steps << " steps";
  }
}

TEST(TrainConfig, RepeatedKeysAreRefusedNotResolved) {
  // yaml-cpp keeps both entries and returns the first: optim.lr would silently be 1e-3.
  expect_error(std::string(kBase) + "optim:\n  lr: 1e-3\n  lr: 3e-4\n",
               "<string>: optim.lr is given twice (lines 7 and 8); keep one");
  expect_error(std::string(kBase) + "optim:\n  lr: 1e-3\noptim:\n  beta1: 0.8\n",
               "optim is given twice (lines 6 and 8)");
  expect_error(kBase, "--set optim.lr is given twice (optim.lr=1 and optim.lr=2); give it once",
               {"optim.lr=1", "optim.lr=2"});
  // One key in the file and once in --set is an override, not a repeat.
  EXPECT_DOUBLE_EQ(parse_train_config(std::string(kBase) + "optim:\n  lr: 1e-3\n", {"optim.lr=2e-3"}).optim.lr, 2e-3);
}

TEST(TrainConfig, PrecisionAndLossScaling) {
  EXPECT_EQ(parse_train_config(kBase, {}).model.precision, model::Precision::fp32);
  const TrainConfig c = parse_train_config(kBase, {"model.precision=bf16"});
  EXPECT_EQ(c.model.precision, model::Precision::bf16);
  EXPECT_EQ(c.model.products(), cpu::ProductPrecision::bf16);
  // How the products run depends on the CPU, so the trainer says it at start
  // (bf16_training_test.sh), not the configuration.
  EXPECT_TRUE(c.warnings.empty()) << c.warnings[0];
  EXPECT_NE(c.model.summary().find("bf16 products"), std::string::npos) << c.model.summary();
  EXPECT_EQ(c.parallel.grad_dtype, DType::bf16);  // gradients follow the precision unless told
  EXPECT_EQ(parse_train_config(kBase, {}).parallel.grad_dtype, DType::f32);
  EXPECT_EQ(parse_train_config(kBase, {"model.precision=bf16", "parallel.grad_dtype=fp32"}).parallel.grad_dtype,
            DType::f32);
  expect_error(kBase, "parallel.grad_dtype: \"fp16\" is not one of: fp32, bf16", {"parallel.grad_dtype=fp16"});
  const TrainConfig h = parse_train_config(kBase, {"model.precision=fp16", "optim.loss_scale_window=50"});
  EXPECT_EQ(h.model.products(), cpu::ProductPrecision::f16);
  EXPECT_TRUE(h.loss_scale.dynamic);  // fp16 scales its loss unless told otherwise, and then refuses
  EXPECT_EQ(h.loss_scale.initial, 65536);
  EXPECT_EQ(h.loss_scale.window, 50);
  EXPECT_FALSE(c.loss_scale.dynamic);
  expect_error(kBase, "model.precision=fp16 needs optim.loss_scale=dynamic: fp16 gradients underflow",
               {"model.precision=fp16", "optim.loss_scale=off"});
  expect_error(kBase, "optim.loss_scale=dynamic is for model.precision=fp16", {"optim.loss_scale=dynamic"});
  expect_error(kBase, "model.precision: \"int8\" is not one of: fp32, bf16, fp16", {"model.precision=int8"});
}
