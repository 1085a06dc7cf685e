// Invariant 1 for data parallelism: under mpiexec with N ranks, training with dp=N and ZeRO
// stages 0-3 (with and without gradient accumulation and activation checkpointing, GPT-2 and
// LLaMA/GQA) gives the per-step losses and final weights of a single-process run of the same
// global batch. Tolerance: reductions sum in a different order, so results agree to float
// rounding, not bitwise. Losses: |a - b| <= 1e-5 |b|. Weights after 20 AdamW steps:
// |a - b| <= 1e-5 |b| + 1e-3 lr, except that Adam divides every gradient by its own running
// size, so an element whose gradient is nearly zero turns rounding noise into a step of up
// to lr: at most 0.05% of the elements may exceed that bound, and none may differ by more
// than 1% of lr * steps. GPT-2's key bias gets no gradient at all in exact arithmetic (a
// constant added to every key of a row does not change its softmax), so its elements are
// pure noise and are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "comm/mpi/mpi_world.h"
#include "loom/core/timer.h"
#include "loom/parallel/mesh.h"
#include "loom/train/trainer.h"
#include "parallel/mpi/synthetic_source.h"
#include "parallel/mpi/weights_close.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;

namespace {

using loom::testing::shared_empty_dir;

using loom::testing::SyntheticSource;

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> weights;
};

TrainConfig make_config(const std::string& preset, int dp, int zero, int64_t micro, int ckpt, int64_t steps,
                        const std::string& ckpt_dir = "", const std::string& precision = "fp32") {
  std::vector<std::string> sets = {"model.preset=" + preset,
                                   "model.activation_checkpoint_interval=" + std::to_string(ckpt),
                                   "model.precision=" + precision,
                                   "data.dir=unused",
                                   "data.seq_len=16",
                                   "data.batch_size=8",
                                   "data.micro_batch_size=" + std::to_string(micro),
                                   "optim.lr=3e-3",
                                   "schedule.steps=" + std::to_string(steps),
                                   "schedule.warmup_steps=2",
                                   "schedule.eval_interval=0",
                                   "schedule.eval_batches=4",
                                   "log.every=1000",
                                   "log.progress=off",
                                   "parallel.dp=" + std::to_string(dp),
                                   "parallel.zero_stage=" + std::to_string(zero),
                                   "parallel.bucket_mb=0.01"};
  if (!ckpt_dir.empty()) sets.push_back("checkpoint.dir=" + ckpt_dir);
  return parse_train_config("{}", sets);
}

TrainRun run_training(const TrainConfig& cfg, const parallel::Mesh* mesh, const std::string& resume = "",
                      int64_t stop = -1) {
  SyntheticSource src(cfg.model.vocab_size);
  const TrainerOptions o = loom::testing::quiet_trainer_options(mesh, resume, stop);
  Trainer t(cfg, src, o);
  TrainRun r;
  r.losses = t.run().losses;
  r.weights = t.full_params().to_f32_vector();
  return r;
}

// `steps`: the AdamW steps the weights went through (default: one per compared loss).
void expect_close(const TrainRun& a, const TrainRun& ref, const model::ParamLayout& dist_layout,
                  const model::ParamLayout& ref_layout, const std::string& what, int64_t steps = -1,
                  bool bf16 = false) {
  ASSERT_EQ(a.losses.size(), ref.losses.size()) << what;
  const double rel = bf16 ? loom::testing::kBf16LossTolerance : 1e-5;
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], ref.losses[i], rel * std::abs(ref.losses[i]) + 2e-7) << what << ": loss at step " << i + 1;
  loom::testing::expect_weights_close(a.weights, dist_layout, ref.weights, ref_layout, 3e-3,
                                      double(steps > 0 ? steps : int64_t(a.losses.size())), what,
                                      bf16 ? loom::testing::bf16_weight_tolerance() : loom::testing::WeightTolerance{});
}

}  // namespace

// bf16 (model.precision=bf16, and so parallel.grad_dtype=bf16): products round their operands to
// bf16, and gradients cross the wire in bf16 with every partial sum rounded. A reduction
// order's f32 noise then sometimes moves an operand across a bf16 rounding boundary, each such
// flip spreads through later products, and the dp runs' gradients carry bf16 rounding the
// single process's do not. Measured here (both families, ZeRO 0-3, 1-2 micro-batches,
// checkpointing, 2 and 4 ranks) and in mp_equivalence_test.cpp (tp, pp and 3D layouts on 2-8
// ranks), and for fp16 in DataParallelFp16 below: losses within 9.3e-5 relative (f32: within
// 1e-5); weights beyond 0.2 lr for at most 0.91% of the elements, none beyond 6.1% of lr * steps
// (with f32 gradients on the wire: at most 0.26% beyond 0.05 lr, none beyond 4.3%). The bf16 tolerances: losses 5e-4
// relative, at most 3% of the weights beyond 1e-5 relative + 0.2 lr, none beyond 15% of lr * steps (weights_close.h).
class DataParallelEquivalence : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(DataParallelEquivalence, EveryZeroStageMatchesOneProcess) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  const std::string preset = std::get<0>(GetParam()), precision = std::get<1>(GetParam());
  const int64_t steps = 20;
  for (int ckpt : {0, 1}) {
    // The reference: one process, the whole global batch at once, no communication.
    TrainConfig ref_cfg = make_config(preset, 1, 0, 8, ckpt, steps, "", precision);
    const TrainRun ref = run_training(ref_cfg, nullptr);
    model::ParamLayout ref_layout(ref_cfg.model, 1), dist_layout(ref_cfg.model, N);
    for (int zero = 0; zero <= 3; ++zero)
      for (int64_t micro : {int64_t(8 / N), int64_t(8 / N / 2)}) {  // one micro-batch, or two
        if (micro < 1) continue;
        const std::string what = preset + " " + precision + " dp=" + std::to_string(N) +
                                 " zero=" + std::to_string(zero) + " micro=" + std::to_string(micro) +
                                 " ckpt=" + std::to_string(ckpt);
        const TrainRun r = run_training(make_config(preset, N, zero, micro, ckpt, steps, "", precision), &mesh);
        expect_close(r, ref, dist_layout, ref_layout, what, -1, precision == "bf16");
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DataParallelEquivalence,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama-tiny"),
                                            ::testing::Values("fp32", "bf16")),
                         [](const auto& info) {
                           std::string n = std::string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The layouts that keep no whole fp32 copy of the weights: ZeRO-3, and in bf16 ZeRO-1 and -2
// with their 16-bit weight replica. The checkpoint holds the f32 masters and moments the bf16
// products round from, and a resume rebuilds the replica from them.
TEST(DataParallelResume, ShardedMastersResumeExactlyOnTheSameLayout) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  for (const auto& [precision, zero] :
       std::vector<std::pair<std::string, int>>{{"fp32", 3}, {"bf16", 3}, {"bf16", 1}, {"bf16", 2}}) {
    const std::string what = precision + " ZeRO-" + std::to_string(zero);
    const std::string dir = shared_empty_dir(world, "loom_dp_resume_" + precision + std::to_string(zero));
    TrainConfig cfg = make_config("llama-tiny", N, zero, 8 / N, 0, 10, dir, precision);
    if (zero < 3) cfg.parallel.weight_replica = parallel::WeightReplica::on;
    TrainConfig straight_cfg = cfg;
    straight_cfg.checkpoint.dir = dir + "/straight";
    const TrainRun straight = run_training(straight_cfg, &mesh);
    run_training(cfg, &mesh, "", 5);                            // 5 steps, checkpoint
    const TrainRun resumed = run_training(cfg, &mesh, "auto");  // the other 5
    ASSERT_EQ(resumed.losses.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[5 + i]) << what << " step " << 6 + i;
    EXPECT_EQ(resumed.weights, straight.weights) << what << ": weights differ bitwise after resume";
  }
}

// A purely data-parallel checkpoint resumes on another dp size and ZeRO stage: each rank re-cuts
// its chunk of every unit's Adam moments from the saved shards. Reference: the same 10 steps in
// one process without interruption; the resumed runs' last 5 steps must match it as closely as
// any dp run does (reductions sum in another order).
TEST(DataParallelResume, ReshardsAcrossDpSizeAndZeroStage) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  const std::string base = shared_empty_dir(world, "loom_dp_reshard");
  const int64_t micro = 8 / N;
  const TrainConfig one_cfg = make_config("gpt2-tiny", 1, 0, 8, 0, 10);
  TrainRun ref = run_training(one_cfg, nullptr);
  ref.losses.erase(ref.losses.begin(), ref.losses.begin() + 5);  // the steps after a resume
  const model::ParamLayout one(one_cfg.model, 1), dist(one_cfg.model, N);
  const std::string mine = base + "/rank" + std::to_string(world.rank());  // per-rank outputs
  // dp=N with ZeRO-1, saved after 2, 4 and 5 steps; resumed as dp=N ZeRO-3, and as one process.
  TrainConfig a_cfg = make_config("gpt2-tiny", N, 1, micro, 0, 10, base + "/a");
  a_cfg.checkpoint.every_steps = 2;
  run_training(a_cfg, &mesh, "", 5);
  expect_close(run_training(make_config("gpt2-tiny", N, 3, micro, 0, 10, base + "/a3"), &mesh, base + "/a/step_000005"),
               ref, dist, one, "dp=N ZeRO-1 -> dp=N ZeRO-3", 10);
  expect_close(run_training(make_config("gpt2-tiny", 1, 0, 8, 0, 10, mine + "/a1"), nullptr, base + "/a/step_000005"),
               ref, one, one, "dp=N ZeRO-1 -> one process", 10);
  // dp=N with ZeRO-0 (every shard the whole state; ranks read different copies) -> ZeRO-1.
  run_training(make_config("gpt2-tiny", N, 0, micro, 0, 10, base + "/z"), &mesh, "", 5);
  expect_close(run_training(make_config("gpt2-tiny", N, 1, micro, 0, 10, base + "/z1"), &mesh, base + "/z/step_000005"),
               ref, dist, one, "dp=N ZeRO-0 -> dp=N ZeRO-1", 10);
  // One process, saved after 5 steps (every rank writes its own; rank 0's is used), resumed as
  // dp=N with ZeRO-2.
  run_training(make_config("gpt2-tiny", 1, 0, 8, 0, 10, mine + "/b"), nullptr, "", 5);
  world.barrier();
  expect_close(
      run_training(make_config("gpt2-tiny", N, 2, micro, 0, 10, base + "/b2"), &mesh, base + "/rank0/b/step_000005"),
      ref, dist, one, "one process -> dp=N ZeRO-2", 10);
  if (N == 4) {  // dp=4 -> dp=2: each half of the world resumes alone, into its own directory
    const comm::Group half = world.split(world.rank() / 2, world.rank() % 2);
    parallel::Mesh half_mesh(half, parallel::MeshShape(1, 2, 1, 1));
    const model::ParamLayout dist2(one_cfg.model, 2);
    const std::string out = base + "/half" + std::to_string(world.rank() / 2);
    expect_close(run_training(make_config("gpt2-tiny", 2, 3, 4, 0, 10, out), &half_mesh, base + "/a/step_000005"), ref,
                 dist2, one, "dp=4 ZeRO-1 -> dp=2 ZeRO-3", 10);
  }
  // A one-process resume of step 5 reads the Adam moments; with them damaged, --resume auto must
  // fall back to step 4 (it verifies what the resume reads, not only the weights).
  world.barrier();  // last: it damages the step-5 checkpoint the runs above read
  if (world.rank() == 0) {
    EXPECT_TRUE(loom::testing::flip_byte(base + "/a/step_000005/optimizer.exp_avg_sq.safetensors", 100, 0x08));
    TrainConfig auto_cfg = make_config("gpt2-tiny", 1, 0, 8, 0, 10, base + "/a");
    SyntheticSource src(auto_cfg.model.vocab_size);
    Trainer t(auto_cfg, src, loom::testing::quiet_trainer_options(nullptr, "auto", -1));
    EXPECT_EQ(t.step(), 4);
  }
  world.barrier();
}

// Each rank checksums only the files it loads (the weights, the moments and its own 1-bit Adam
// error feedback), so an error file corrupted on disk is seen by one rank alone; the ranks must
// still agree to skip that checkpoint, or they would load different steps.
TEST(DataParallelResume, EveryRankSkipsACheckpointWithOneCorruptRankFile) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  const std::string dir = shared_empty_dir(world, "loom_dp_resume_corrupt");
  TrainConfig cfg = make_config("gpt2-tiny", N, 1, 8 / N, 0, 6, dir);
  cfg.optim.kind = optim::OptimizerKind::onebit_adam;  // the optimizer whose state has a per-rank part
  cfg.optim.freeze_step = 2;
  cfg.checkpoint.every_steps = 2;
  run_training(cfg, &mesh);  // checkpoints after steps 2, 4 and 6
  if (world.rank() == 0) {   // one byte of the last rank's error file of step 6, size unchanged
    char name[64];
    std::snprintf(name, sizeof name, "/step_000006/onebit.rank%05d.safetensors", N - 1);
    // EXPECT, not ASSERT: the other ranks wait at the barrier below.
    EXPECT_TRUE(loom::testing::flip_byte(dir + name, 120, 0x10)) << dir + name;
  }
  world.barrier();
  SyntheticSource src(cfg.model.vocab_size);
  Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh, "auto", -1));
  EXPECT_EQ(t.step(), 4) << "rank " << world.rank();
  // Naming the damaged checkpoint fails on every rank, not only on the one holding the file
  // (the others would otherwise wait for it in the first collective).
  try {
    Trainer named(cfg, src, loom::testing::quiet_trainer_options(&mesh, dir + "/step_000006", -1));
    ADD_FAILURE() << "rank " << world.rank() << " resumed from a checkpoint with a corrupt error file";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("failed verification"), std::string::npos) << m;
    if (N > 1 && world.rank() != N - 1) {
      EXPECT_NE(m.find("on rank " + std::to_string(N - 1)), std::string::npos) << m;
    }
  }
}

TEST(DataParallelMemory, ModelStatesFollowTheZeroFormulas) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  // fp32, and bf16 whose stages 1-2 (on 2 or more ranks) keep the 16-bit weight replica: the
  // product weights in 2 bytes, the tables, norms and biases in 4, the fp32 masters of the
  // rank's chunks with the optimizer.
  for (const std::string precision : {"fp32", "bf16"})
    for (int zero = 0; zero <= 3; ++zero) {
      TrainConfig cfg = make_config("gpt2-tiny", N, zero, 8 / N, 0, 1, "", precision);
      cfg.model.d_model = 64;  // large enough that unit padding is noise
      cfg.model.d_ff = 256;
      if (precision == "bf16" && (zero == 1 || zero == 2)) cfg.parallel.weight_replica = parallel::WeightReplica::on;
      SyntheticSource src(cfg.model.vocab_size);
      const TrainerOptions o = loom::testing::quiet_trainer_options(&mesh);
      const MemorySnapshot before = cpu_allocator().snapshot();
      {
        Trainer t(cfg, src, o);
        t.run();  // a step allocates whatever the step needs
        const MemorySnapshot after = cpu_allocator().snapshot();
        const bool replica = precision == "bf16" && (zero == 1 || zero == 2);
        EXPECT_EQ(t.data_parallel().keeps_replica(), replica) << precision << " " << zero;
        int64_t product = 0;
        for (const auto& p : t.model().layout().params())
          if (replica && p.product_operand) product += p.numel();
        const auto want = parallel::zero_model_state_bytes(t.model().num_params(), zero, N, replica ? product : -1);
        const std::string what = precision + " ZeRO-" + std::to_string(zero);
        auto delta = [&](MemCategory c) { return double(after[c].current - before[c].current); };
        EXPECT_NEAR(delta(MemCategory::params), double(want.params), 0.05 * double(want.params)) << what;
        EXPECT_NEAR(delta(MemCategory::grads), double(want.grads), 0.05 * double(want.grads)) << what;
        EXPECT_NEAR(delta(MemCategory::optimizer), double(want.optimizer), 0.05 * double(want.optimizer)) << what;
        if (replica) {  // the replica's weights: under the fp32 4P, above 2P (the tables stay f32)
          const double P = double(t.model().num_params());
          EXPECT_LT(delta(MemCategory::params), 3.5 * P) << what;
          EXPECT_GT(delta(MemCategory::params), 2.0 * P) << what;
        }
      }
    }
}

// parallel.grad_dtype=bf16 (the default under model.precision=bf16) halves the bytes of the
// gradient reductions, all-reduce (ZeRO-0) and reduce-scatter (ZeRO-2) alike.
TEST(DataParallelBf16Gradients, HalveTheReductionBytes) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  for (int zero : {0, 2}) {
    const std::string op = zero == 0 ? "all_reduce" : "reduce_scatter";
    double bytes[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const std::string precision = k == 0 ? "fp32" : "bf16";
      const double t0 = now_seconds();
      run_training(make_config("gpt2-tiny", N, zero, 8 / N, 0, 2, "", precision), &mesh);
      for (const auto& e : world.record().finished())
        if (e.t_start >= t0 && e.op == op && e.bytes > 64) bytes[k] += double(e.bytes);  // not the norm's scalar
    }
    EXPECT_GT(bytes[0], 0) << op;
    EXPECT_EQ(bytes[1] * 2, bytes[0]) << "ZeRO-" << zero << " " << op << " bytes: fp32 " << bytes[0] << ", bf16 "
                                      << bytes[1];
  }
}

// fp16 with dynamic loss scaling: an overflow injected on world rank 0 alone (its gradients,
// after backward) is seen by every rank through the all-reduced gradient norm, so every rank
// skips that update and halves its scale, and the run still matches the single process with the
// same overflow (fp16 noise: the bf16 tolerances), every ZeRO stage.
TEST(DataParallelFp16, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  const comm::Group& world = test_world();
  const int N = world.size();
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  auto run = [&](int dp, int zero, const parallel::Mesh* m) {
    TrainConfig cfg = make_config("gpt2-tiny", dp, zero, 8 / dp, 0, 12, "", "fp16");
    cfg.loss_scale.initial = 1024;
    cfg.loss_scale.window = 4;
    SyntheticSource src(cfg.model.vocab_size);
    TrainerOptions o = loom::testing::quiet_trainer_options(m);
    o.inject_grad_overflow_at = {3};
    Trainer t(cfg, src, o);
    const TrainResult res = t.run();
    EXPECT_EQ(res.skipped_steps, 1) << "dp=" << dp << " zero=" << zero;
    const std::vector<double> want = {1024, 1024, 1024, 512, 512, 512, 512, 1024, 1024, 1024, 1024, 2048};
    EXPECT_EQ(res.loss_scales, want) << "dp=" << dp << " zero=" << zero;
    return TrainRun{res.losses, t.full_params().to_f32_vector()};
  };
  const TrainRun ref = run(1, 0, nullptr);
  const TrainConfig ref_cfg = make_config("gpt2-tiny", 1, 0, 8, 0, 12, "", "fp16");
  model::ParamLayout ref_layout(ref_cfg.model, 1), dist_layout(ref_cfg.model, N);
  for (int zero = 0; zero <= 3; ++zero)
    expect_close(run(N, zero, &mesh), ref, dist_layout, ref_layout, "fp16 zero=" + std::to_string(zero), 11, true);
}

// parallel.gather_dtype (default: model.precision's 16-bit type): ZeRO's weight all-gathers send
// the products' weights in 16 bits and norms, biases, lookup tables and the router in f32. The
// products round their weights to that type anyway, so the run is bitwise the run with f32
// gathers (a misclassified norm gain or router weight breaks that), for fewer bytes; checkpoints
// and full_params still read the fp32 masters.
TEST(DataParallel16BitGathers, AreBitwiseExactAndSendFewerBytes) {
  const comm::Group& world = test_world();
  const int N = world.size();
  if (N == 1) GTEST_SKIP() << "needs 2 or more ranks";
  parallel::Mesh mesh(world, parallel::MeshShape(1, N, 1, 1));
  for (const std::string preset : {"gpt2-tiny", "llama-moe-tiny"})
    for (const std::string precision : {"bf16", "fp16"})
      for (int zero = 1; zero <= 3; ++zero) {
        const std::string what = preset + " " + precision + " ZeRO-" + std::to_string(zero);
        // f32 gathers; 16-bit gathers (at stages 1-2 into the 16-bit weight replica); and at
        // stages 1-2, 16-bit gathers widened into the fp32 copy (weight_replica=off).
        TrainRun runs[3];
        double bytes[3] = {0, 0, 0};
        const int kinds = zero < 3 ? 3 : 2;
        for (int k = 0; k < kinds; ++k) {
          TrainConfig cfg = make_config(preset, N, zero, 8 / N, zero == 2 ? 1 : 0, 4, "", precision);
          ASSERT_EQ(cfg.parallel.gather_dtype, wire_dtype(precision)) << "the default follows model.precision";
          if (k == 0) cfg.parallel.gather_dtype = DType::f32;
          if (zero < 3)
            cfg.parallel.weight_replica =
                k == 1 ? parallel::WeightReplica::on : parallel::WeightReplica::off;  // auto keeps fp32 copies at dp=2
          SyntheticSource src(cfg.model.vocab_size);
          Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh));
          EXPECT_EQ(t.data_parallel().params_are_masters(), k == 0 && zero < 3) << what << " kind " << k;
          EXPECT_EQ(t.data_parallel().keeps_replica(), k == 1 && zero < 3) << what << " kind " << k;
          const double t0 = now_seconds();
          runs[k].losses = t.run().losses;
          const double t1 = now_seconds();
          runs[k].weights = t.full_params().to_f32_vector();
          // The steps' gathers: weights, and at stage 1 the embedding rows (f32 either way).
          for (const auto& e : world.record().finished())
            if (e.t_start >= t0 && e.t_start < t1 && e.op == "all_gather" && e.bytes > 64) bytes[k] += double(e.bytes);
        }
        for (int k = 1; k < kinds; ++k) {
          const std::string how = what + (k == 1 ? " (16-bit" : " (16-bit, fp32 copy") + ")";
          EXPECT_EQ(runs[k].losses, runs[0].losses) << how << ": losses differ from f32 gathers";
          EXPECT_TRUE(runs[k].weights == runs[0].weights) << how << ": fp32 masters differ from f32 gathers";
        }
        if (kinds == 3) {
          EXPECT_EQ(bytes[2], bytes[1]) << what << ": the replica and the fp32 copy gather alike";
        }
        EXPECT_GT(bytes[0], 0) << what;
        // These tiny models' tables and norms are a third of their weights; stage 1 also gathers
        // the embedding rows.
        EXPECT_LT(bytes[1], (zero == 3 ? 0.7 : 0.85) * bytes[0])
            << what << ": 16-bit gathers " << bytes[1] << " bytes, f32 " << bytes[0];
        EXPECT_GE(bytes[1], 0.5 * bytes[0]) << what;
        if (world.rank() == 0)
          std::printf("[gathers] %s: all_gather bytes 16-bit/f32 = %.3f\n", what.c_str(), bytes[1] / bytes[0]);
      }
}

// Under expert parallelism the experts' units are gathered (and, at stages 1-2, kept as the
// 16-bit replica) over the expert data-parallel group, the dense units over dp x ep: still the
// f32 gathers' training bit for bit. With 2 ranks the experts' group is one rank.
TEST(DataParallel16BitGathers, AreBitwiseExactUnderExpertParallelism) {
  const comm::Group& world = test_world();
  const int N = world.size();
  if (N % 2) GTEST_SKIP() << "needs an even number of ranks";
  parallel::Mesh mesh(world, parallel::MeshShape(1, N / 2, 2, 1));
  for (int zero = 1; zero <= 3; ++zero) {
    const std::string what = "llama-moe-tiny bf16 dp=" + std::to_string(N / 2) + " ep=2 ZeRO-" + std::to_string(zero);
    TrainRun runs[2];
    for (int k = 0; k < 2; ++k) {
      TrainConfig cfg = make_config("llama-moe-tiny", N / 2, zero, 8 / N, 0, 4, "", "bf16");
      cfg.parallel.ep = 2;
      if (k == 0) cfg.parallel.gather_dtype = DType::f32;
      if (k == 1 && zero < 3) cfg.parallel.weight_replica = parallel::WeightReplica::on;
      SyntheticSource src(cfg.model.vocab_size);
      Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh));
      EXPECT_EQ(t.data_parallel().params_are_masters(), k == 0 && zero < 3) << what;
      runs[k].losses = t.run().losses;
      runs[k].weights = t.full_params().to_f32_vector();
    }
    EXPECT_EQ(runs[1].losses, runs[0].losses) << what << ": losses differ from f32 gathers";
    EXPECT_TRUE(runs[1].weights == runs[0].weights) << what << ": fp32 masters differ from f32 gathers";
  }
}

TEST(DataParallel16BitGathers, NeedTheMatchingPrecision) {
  try {
    parse_train_config(
        "{}", {"model.preset=gpt2-tiny", "data.dir=unused", "model.precision=fp32", "parallel.gather_dtype=bf16"});
    FAIL() << "bf16 gathers under fp32 products were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.gather_dtype=bf16 needs model.precision=bf16"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_train_config("{}", {"model.preset=gpt2-tiny", "data.dir=unused", "model.precision=bf16",
                                         "parallel.gather_dtype=fp16"}),
               Error);
  EXPECT_EQ(parse_train_config("{}", {"model.preset=gpt2-tiny", "data.dir=unused", "model.precision=bf16",
                                      "parallel.gather_dtype=fp32"})
                .parallel.gather_dtype,
            DType::f32);
}
