// Bad model-parallel layouts are refused (or warned about) before any work, with the numbers
// in the message: tp not dividing n_head or d_ff, pp above n_layer, ZeRO-2/3 with pipelines,
// micro-batches that do not split the batch, virtual stages that cannot interleave, fewer
// micro-batches than stages (a warning that states the bubble), and a layout the process grid
// does not have.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/model/param_layout.h"
#include "loom/parallel/data_parallel.h"
#include "loom/train/train_config.h"
#include "loom/train/trainer.h"

using namespace loom;
using namespace loom::train;

namespace {
std::vector<std::string> base(std::vector<std::string> extra) {
  std::vector<std::string> s = {"model.preset=gpt2-tiny", "data.dir=/tmp/x", "data.batch_size=8"};
  s.insert(s.end(), extra.begin(), extra.end());
  return s;
}
std::string error_of(std::vector<std::string> sets) {
  try {
    parse_train_config("{}", base(std::move(sets)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
void expect_error(std::vector<std::string> sets, const std::string& want) {
  const std::string e = error_of(std::move(sets));
  EXPECT_NE(e.find(want), std::string::npos) << "got: " << e << "\nwanted: " << want;
  EXPECT_EQ(e.rfind("[config]", 0), 0u) << e;
}
}  // namespace

TEST(LayoutConfig, RefusesLayoutsThatCannotWork) {
  expect_error({"parallel.tp=3"}, "parallel.tp=3 does not divide model.n_head=4");
  expect_error({"parallel.tp=4", "model.d_ff=130"}, "parallel.tp=4 does not divide model.d_ff=130");
  expect_error({"parallel.pp=3"}, "parallel.pp=3 exceeds model.n_layer=2");
  expect_error({"parallel.pp=2", "parallel.zero_stage=2"}, "parallel.zero_stage=2 with parallel.pp=2 is not supported");
  expect_error({"parallel.micro_batches=3"}, "parallel.micro_batches=3 does not divide the per-rank batch 8");
  expect_error({"parallel.micro_batches=2", "data.micro_batch_size=2"},
               "data.micro_batch_size=2 and parallel.micro_batches=2 disagree");
  // Expert parallelism (issue: bad input refused at start, naming the keys).
  expect_error({"parallel.ep=2"}, "parallel.ep=2 needs a Mixture-of-Experts model");
  const std::string moe = "model.moe.num_experts=4";  // GPT-2 experts
  expect_error({moe, "parallel.ep=3"}, "parallel.ep=3 does not divide model.moe.num_experts=4");
  expect_error({moe, "parallel.ep=2", "parallel.dp=3"},
               "data.batch_size=8 is not divisible by parallel.dp x parallel.ep=6");
  expect_error({moe, "model.moe.top_k=5"}, "model.moe.top_k=5 must be between 1 and model.moe.num_experts=4");
  expect_error({moe, "parallel.ep=2", "optim.name=onebit_adam"},
               "optim.name=onebit_adam with parallel.ep=2 is not supported");
  expect_error({moe, "model.moe.score=relu"}, "model.moe.score");
  // Interleaved 1F1B: equal chunks of blocks, micro-batches in groups of pp.
  const std::string four = "model.n_layer=4";
  expect_error({four, "parallel.pp=2", "parallel.virtual_stages=3", "parallel.micro_batches=2"},
               "parallel.virtual_stages=3 needs model.n_layer divisible by parallel.pp x parallel.virtual_stages = 6");
  expect_error({four, "parallel.pp=2", "parallel.virtual_stages=2", "parallel.micro_batches=1"},
               "parallel.micro_batches=1 is not a multiple of 2; use parallel.micro_batches=2");
  expect_error({four, "parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=gpipe"},
               "set parallel.pp_schedule=1f1b or parallel.virtual_stages=1");
  expect_error({"parallel.virtual_stages=2"}, "parallel.virtual_stages=2 needs a pipeline");
  // Zero-bubble: the deferred weight passes read the blocks' saved activations.
  expect_error({"parallel.pp=2", "parallel.pp_schedule=zb1p", "model.activation_checkpoint_interval=1"},
               "parallel.pp_schedule=zb1p defers each block's weight gradients");
  EXPECT_EQ(error_of({"parallel.pp=2", "parallel.pp_schedule=zb1p"}), "");
  EXPECT_EQ(error_of({four, "parallel.pp=2", "parallel.virtual_stages=2", "parallel.micro_batches=4"}), "");
  // ZB-V: two chunks per stage in a V, whatever the micro-batch count; its weight passes are
  // deferred like ZB-H1's.
  expect_error({"parallel.pp=2", "parallel.pp_schedule=zbv"},
               "parallel.pp_schedule=zbv needs model.n_layer divisible by 2 x parallel.pp = 4");
  expect_error({four, "parallel.pp=2", "parallel.pp_schedule=zbv", "parallel.virtual_stages=4"},
               "parallel.pp_schedule=zbv places 2 chunks of blocks on each stage");
  expect_error({four, "parallel.pp=2", "parallel.pp_schedule=zbv", "model.activation_checkpoint_interval=1"},
               "parallel.pp_schedule=zbv defers each block's weight gradients");
  const TrainConfig zbv =
      parse_train_config("{}", base({four, "parallel.pp=2", "parallel.pp_schedule=zbv", "parallel.micro_batches=1"}));
  EXPECT_EQ(zbv.parallel.virtual_stages, 2);
  EXPECT_EQ(parse_train_config("{}", base({"parallel.pp_schedule=zbv"})).parallel.virtual_stages, 1);  // no pipeline
}

// parallel.micro_batches=auto starts from data.micro_batch_size when given, else from the
// smallest count that fills the pipeline (a multiple of pp when interleaved; one without a
// pipeline); anything but a count or auto is refused.
TEST(LayoutConfig, AutoMicroBatchesResolveTheirStart) {
  auto start = [](std::vector<std::string> sets) {
    sets.push_back("parallel.micro_batches=auto");
    const TrainConfig c = parse_train_config("{}", base(std::move(sets)));
    EXPECT_TRUE(c.parallel.micro_batches_auto);
    EXPECT_EQ(c.data.micro_batch_size * c.parallel.micro_batches, 8 / c.parallel.dp);
    return c.parallel.micro_batches;
  };
  EXPECT_EQ(start({}), 1);
  EXPECT_EQ(start({"parallel.pp=2"}), 2);
  EXPECT_EQ(start({"model.n_layer=3", "parallel.pp=3"}), 4);  // 3 does not divide 8
  EXPECT_EQ(start({"parallel.dp=2", "data.micro_batch_size=1"}), 4);
  EXPECT_EQ(start({"model.n_layer=4", "parallel.pp=2", "parallel.virtual_stages=2"}), 2);
  EXPECT_FALSE(parse_train_config("{}", base({"parallel.micro_batches=4"})).parallel.micro_batches_auto);
  expect_error({"parallel.micro_batches=some"},
               "parallel.micro_batches: expected a number of micro-batches per step or auto, got \"some\"");
}

TEST(LayoutConfig, MicroBatchesResolveAndFewerThanStagesWarnsWithTheBubble) {
  TrainConfig c = parse_train_config("{}", base({"parallel.dp=2", "parallel.micro_batches=4"}));
  EXPECT_EQ(c.data.micro_batch_size, 1);  // 8 / dp 2 / 4
  EXPECT_TRUE(c.warnings.empty());
  c = parse_train_config("{}", base({"data.micro_batch_size=2"}));
  EXPECT_EQ(c.parallel.micro_batches, 4);
  c = parse_train_config("{}", base({"parallel.pp=2", "parallel.micro_batches=1"}));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("parallel.micro_batches=1 is below parallel.pp=2"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[0].find("(p-1)/(m+p-1) = 1/2 = 50%"), std::string::npos) << c.warnings[0];
}

namespace {
class NoData final : public BatchSource {
 public:
  void fill_train(int64_t, int64_t, int64_t, int64_t, int64_t, int32_t*, int32_t*, int32_t*) override {}
  void fill_val(int64_t, int64_t, int64_t, int32_t*, int32_t*, int32_t*) override {}
  int64_t vocab_size() const override { return 97; }
  bool has_val() const override { return false; }
};
}  // namespace

TEST(LayoutConfig, TrainerRefusesALayoutTheMeshDoesNotHave) {
  const TrainConfig c = parse_train_config("{}", base({"parallel.pp=2", "parallel.tp=2"}));
  NoData data;
  TrainerOptions o;
  o.log = std::fopen("/dev/null", "w");
  try {
    Trainer t(c, data, o);  // one process: a 1 x 1 x 1 x 1 mesh
    ADD_FAILURE() << "pp=2 x tp=2 in one process should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pp=2 but the mesh has pp=1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("launch pp x dp x ep x tp = 4 processes"), std::string::npos) << e.what();
  }
  std::fclose(o.log);
}

// parallel.weight_replica: ZeRO-1/2 with 16-bit gathers keep the 16-bit replica and the owned
// fp32 masters where they take fewer bytes than a whole fp32 copy (auto), or as told.
TEST(LayoutConfig, WeightReplicaWhereItTakesFewerBytesOrWhereForced) {
  expect_error({"model.precision=bf16", "parallel.zero_stage=0", "parallel.weight_replica=on"},
               "parallel.weight_replica=on needs parallel.zero_stage 1 or 2");
  expect_error(
      {"model.precision=bf16", "parallel.zero_stage=1", "parallel.gather_dtype=fp32", "parallel.weight_replica=on"},
      "the gathers are fp32");
  expect_error({"model.precision=bf16", "parallel.zero_stage=3", "parallel.weight_replica=on"}, "zero_stage=3");
  expect_error({"parallel.weight_replica=yes"}, "parallel.weight_replica");
  EXPECT_EQ(error_of({"model.precision=bf16", "parallel.zero_stage=2", "parallel.weight_replica=on"}), "");

  using R = parallel::DataParallelOptions::Replica;
  const model::ModelConfig gpt2 = model::preset("gpt2-124m");
  auto keeps = [&](int zero, int n, R r, DType gather = DType::bf16,
                   optim::OptimizerKind optimizer = optim::OptimizerKind::adamw) {
    return parallel::keeps_weight_replica({zero, 25, DType::bf16, gather, r}, optimizer, model::ParamLayout(gpt2, n), n,
                                          n);
  };
  // GPT-2's tied token table (31% of the weights) stays f32: 2 x 0.69 + 4 x 0.31 + 4/N bytes
  // per parameter against 4 is more at N=2, less from N=3.
  EXPECT_FALSE(keeps(1, 2, R::auto_choice));
  EXPECT_TRUE(keeps(1, 3, R::auto_choice));
  EXPECT_TRUE(keeps(2, 8, R::auto_choice));
  EXPECT_TRUE(keeps(1, 2, R::on));
  EXPECT_FALSE(keeps(1, 8, R::off));
  EXPECT_FALSE(keeps(3, 8, R::auto_choice));              // stage 3 shards the weights anyway
  EXPECT_FALSE(keeps(0, 8, R::auto_choice));              // stage 0 gathers nothing
  EXPECT_FALSE(keeps(1, 8, R::auto_choice, DType::f32));  // f32 gathers
  EXPECT_FALSE(keeps(1, 8, R::auto_choice, DType::bf16, optim::OptimizerKind::onebit_adam));  // 1-bit Adam gathers f32
  EXPECT_THROW(keeps(1, 8, R::on, DType::bf16, optim::OptimizerKind::onebit_adam), Error);
}
