// plan_data_parallel on its own, without a group or a model: the one place that decides the
// weight replica, the decoder options and the predicted model-state bytes agrees with the
// functions it composes, and 1-bit Adam's gathers and error feedback are counted in.
#include <gtest/gtest.h>

#include "loom/model/config.h"
#include "loom/parallel/data_parallel_plan.h"

using namespace loom;
using parallel::WeightReplica;

TEST(DataParallelPlan, DecidesTheReplicaTheDecoderOptionsAndTheBytesOnce) {
  const model::ModelConfig gpt2 = model::preset("gpt2-124m");
  const model::ParamLayout layout(gpt2, 8);
  const parallel::DataParallelOptions opt{1, 25, DType::bf16, DType::bf16, WeightReplica::auto_choice};
  const auto plan = parallel::plan_data_parallel(opt, optim::OptimizerKind::adamw, layout, {8, 8});
  EXPECT_TRUE(plan.weight_replica);  // 8 ranks: replica and owned masters take fewer bytes
  const model::DecoderOptions d = plan.decoder_options({});
  EXPECT_EQ(d.unit_align, 8);
  EXPECT_TRUE(d.allocate_flat_grads);
  EXPECT_FALSE(d.allocate_flat_params);  // the replica replaces the fp32 copy
  const auto want = parallel::layout_model_state_bytes(layout, 1, 8, 8, true);
  EXPECT_EQ(plan.model_states.total(), want.total());
  EXPECT_EQ(plan.model_states.optimizer, want.optimizer);

  // 1-bit Adam gathers f32 (no replica) and keeps an error buffer per parameter and per chunk.
  const auto onebit = parallel::plan_data_parallel(opt, optim::OptimizerKind::onebit_adam, layout, {8, 8});
  EXPECT_FALSE(onebit.weight_replica);
  EXPECT_TRUE(onebit.decoder_options({}).allocate_flat_params);
  const auto plain = parallel::layout_model_state_bytes(layout, 1, 8, 8, false);
  EXPECT_EQ(onebit.model_states.params, plain.params);
  EXPECT_EQ(onebit.model_states.optimizer, plain.optimizer + parallel::onebit_error_bytes(layout.num_params(), 8));

  // Dense units shard over dp x ep ranks, expert units over dp.
  const auto ranks = parallel::Layout{.dp = 2, .ep = 4}.data_parallel_ranks();
  EXPECT_EQ(ranks.dp_size, 8);
  EXPECT_EQ(ranks.expert_dp_size, 2);
}

TEST(DataParallelPlan, ForcedReplicaWithoutSixteenBitGathersIsRefused) {
  const model::ModelConfig gpt2 = model::preset("gpt2-124m");
  const parallel::DataParallelOptions opt{1, 25, DType::f32, DType::f32, WeightReplica::on};
  EXPECT_THROW(parallel::plan_data_parallel(opt, optim::OptimizerKind::adamw, model::ParamLayout(gpt2, 2), {2, 2}),
               Error);
}
