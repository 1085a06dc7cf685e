// 1-bit Adam (optim.name=onebit_adam) under mpiexec: the warm-up is AdamW exactly; after the
// freeze each step sends under a tenth of AdamW's gradient bytes, the replicas stay
// bitwise identical, training keeps learning, the error feedback keeps the weights near AdamW's
// (a run without it does not), and a checkpoint (which holds every rank's
// error-feedback buffers) resumes exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "comm/mpi/mpi_world.h"
#include "loom/parallel/mesh.h"
#include "loom/train/trainer.h"
#include "parallel/mpi/synthetic_source.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;

namespace {

using loom::testing::shared_empty_dir;

TrainConfig onebit_config(int dp, const std::string& optim, int64_t freeze, int64_t steps,
                          const std::string& ckpt_dir = "", int zero = 0, const std::string& preset = "gpt2-tiny") {
  std::vector<std::string> sets = {"model.preset=" + preset,
                                   "data.dir=unused",
                                   "data.seq_len=16",
                                   "data.batch_size=8",
                                   "data.micro_batch_size=" + std::to_string(8 / dp),
                                   "optim.lr=3e-3",
                                   "optim.name=" + optim,
                                   "optim.freeze_step=" + std::to_string(freeze),
                                   "schedule.steps=" + std::to_string(steps),
                                   "schedule.warmup_steps=2",
                                   "schedule.eval_interval=0",
                                   "log.every=1000",
                                   "log.progress=off",
                                   "parallel.dp=" + std::to_string(dp),
                                   "parallel.zero_stage=" + std::to_string(zero),
                                   "parallel.bucket_mb=0.01"};
  if (!ckpt_dir.empty()) sets.push_back("checkpoint.dir=" + ckpt_dir);
  return parse_train_config("{}", sets);
}

struct OneBitRun {
  std::vector<double> losses;
  std::vector<float> weights;
  int64_t last_wire_bytes = 0;
};

OneBitRun train_run(const TrainConfig& cfg, const parallel::Mesh& mesh, const std::string& resume = "",
                    int64_t stop = -1, bool error_feedback = true) {
  loom::testing::SyntheticSource src(cfg.model.vocab_size);
  Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh, resume, stop));
  for (const auto& exchange : t.data_parallel().onebit()) exchange->set_error_feedback(error_feedback);
  OneBitRun r;
  r.losses = t.run().losses;
  r.weights = t.full_params().to_f32_vector();
  r.last_wire_bytes = t.data_parallel().last_step_wire_bytes();
  return r;
}

}  // namespace

// ZeRO-0 (DeepSpeed's algorithm: compressed momentum) and ZeRO-1 (compressed gradients to
// each chunk's owner, compressed weight changes back).
class DataParallelOneBitAdam : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelOneBitAdam, WarmupIsAdamWBitwise) {
  const comm::Group& world = test_world();
  const int zero = GetParam();
  parallel::Mesh mesh(world, parallel::MeshShape(1, world.size(), 1, 1));
  const OneBitRun adam = train_run(onebit_config(world.size(), "adamw", 100, 6, "", zero), mesh);
  const OneBitRun onebit = train_run(onebit_config(world.size(), "onebit_adam", 100, 6, "", zero), mesh);
  EXPECT_EQ(onebit.losses, adam.losses);
  EXPECT_EQ(onebit.weights, adam.weights);
}

TEST_P(DataParallelOneBitAdam, AfterTheFreezeSendsUnderATenthAndStillLearns) {
  const comm::Group& world = test_world();
  const int N = world.size(), zero = GetParam();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  const int64_t steps = 40, freeze = 10;
  const OneBitRun adam = train_run(onebit_config(N, "adamw", freeze, steps, "", zero), mesh);
  const OneBitRun onebit = train_run(onebit_config(N, "onebit_adam", freeze, steps, "", zero), mesh);
  const OneBitRun lossy =  // the same without the error feedback
      train_run(onebit_config(N, "onebit_adam", freeze, steps, "", zero), mesh, "", -1, /*error_feedback=*/false);
  ASSERT_EQ(onebit.losses.size(), size_t(steps));
  EXPECT_GT(adam.last_wire_bytes, 0);
  EXPECT_LE(double(onebit.last_wire_bytes), 0.1 * double(adam.last_wire_bytes))
      << "ZeRO-" << zero << ": 1-bit " << onebit.last_wire_bytes << " bytes, AdamW " << adam.last_wire_bytes;
  // It learns after the freeze, and does not drift far from AdamW: the mean loss of the last
  // 10 steps within 10% of AdamW's (measured, deterministic: ZeRO-0 3.6% above on 2 ranks,
  // 7.6% on 4; ZeRO-1 -0.2% and 4.6%). A guard against divergence only: the loss does not show
  // the error feedback (without it ZeRO-1 ends 8-13% *below* AdamW).
  auto tail_mean = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 10; i < l.size(); ++i) s += l[i];
    return s / 10;
  };
  EXPECT_LT(tail_mean(onebit.losses), onebit.losses[size_t(freeze)] * 0.95);
  EXPECT_NEAR(tail_mean(onebit.losses), tail_mean(adam.losses), 0.1 * tail_mean(adam.losses)) << "ZeRO-" << zero;
  // The error feedback: what compression drops is carried into the next step, so the sum of the
  // applied updates stays within one step's residual of the exact one and the weights follow
  // AdamW's path; dropped instead, the losses add up over the 30 compressed steps. Relative
  // distance ||w - w_adamw|| / ||w_adamw||, measured on 2 and 4 ranks: ZeRO-0 0.09-0.10 with
  // the feedback, 0.38-0.39 without; ZeRO-1 0.07-0.08 with, 0.17-0.20 without. The bound sits
  // between, and the run without the feedback must break it.
  auto distance = [&](const std::vector<float>& w) {
    double d = 0, n = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      d += (double(w[i]) - adam.weights[i]) * (double(w[i]) - adam.weights[i]);
      n += double(adam.weights[i]) * adam.weights[i];
    }
    return std::sqrt(d / n);
  };
  const double bound = zero == 0 ? 0.2 : 0.12;
  EXPECT_LT(distance(onebit.weights), bound) << "ZeRO-" << zero << " on " << N << " ranks";
  EXPECT_GT(distance(lossy.weights), bound)
      << "ZeRO-" << zero << " on " << N << " ranks: the bound passes a run without error feedback";
  // Every replica holds the same weights (the compressed collectives' results are the same
  // bytes everywhere): rank 0's broadcast equals each rank's own.
  Tensor mine = Tensor::from_vector(onebit.weights, {int64_t(onebit.weights.size())});
  Tensor root = mine.clone();
  world.broadcast(root, 0);
  EXPECT_EQ(root.to_f32_vector(), onebit.weights) << "rank " << world.rank() << " drifted from rank 0";
}

// LLaMA's token table (not tied to the head) gets no gradient for tokens the data has not
// shown: their rows have v = 0 at the freeze, and the compressed momentum's sign noise over
// eps threw them to 1e4-1e5 and the loss with them (llama-60m on Tiny Shakespeare's GPT-2
// tokens went from 6.1 to 22 ten steps after the freeze). They keep still apart from the decay;
// under ZeRO-1 the weight changes travel compressed too, so they wander within the error
// feedback's residual (under lr = 3e-3) instead.
TEST_P(DataParallelOneBitAdam, RowsOfUnseenTokensKeepStillAfterTheFreeze) {
  const comm::Group& world = test_world();
  const int N = world.size(), zero = GetParam();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  const TrainConfig cfg = onebit_config(N, "onebit_adam", 4, 16, "", zero, "llama-tiny");
  const int64_t seen = cfg.model.vocab_size / 2;  // the data uses the first half of the vocabulary
  loom::testing::SyntheticSource src(seen);
  Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh));
  const std::vector<float> before = t.full_params().to_f32_vector();
  const std::vector<double> losses = t.run().losses;
  const std::vector<float> after = t.full_params().to_f32_vector();
  const model::ParamInfo& table = t.model().layout().get("model.embed_tokens.weight");
  const int64_t C = table.shape[1];
  const double residual = zero == 1 ? 3e-3 : 0.0;
  for (int64_t i = table.offset + seen * C; i < table.offset + table.numel(); ++i)
    ASSERT_NEAR(after[size_t(i)], before[size_t(i)], 0.01 * std::fabs(before[size_t(i)]) + residual + 1e-7)
        << "ZeRO-" << zero << ": unseen token row " << (i - table.offset) / C << " moved";
  for (double l : losses) ASSERT_TRUE(std::isfinite(l) && l < 2 * losses.front()) << "ZeRO-" << zero;
}

TEST_P(DataParallelOneBitAdam, ResumesExactlyWithTheErrorFeedback) {
  const comm::Group& world = test_world();
  const int N = world.size(), zero = GetParam();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  const std::string dir = shared_empty_dir(world, "loom_onebit_resume_zero" + std::to_string(zero));
  const OneBitRun straight = train_run(onebit_config(N, "onebit_adam", 3, 10, dir + "/straight", zero), mesh);
  const TrainConfig cfg = onebit_config(N, "onebit_adam", 3, 10, dir + "/split", zero);
  train_run(cfg, mesh, "", 6);  // 6 steps (3 compressed), checkpoint
  const OneBitRun resumed = train_run(cfg, mesh, "auto");
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[6 + i]) << "step " << 7 + i;
  EXPECT_EQ(resumed.weights, straight.weights) << "weights differ after resume";
}

INSTANTIATE_TEST_SUITE_P(Zero, DataParallelOneBitAdam, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& i) { return "Stage" + std::to_string(i.param); });
