// model.init_from under mpiexec: every layout the ranks allow (dp with ZeRO 1-3, tp x dp with
// ZeRO-1, pp x dp, and from 4 ranks pp x dp x tp with ZeRO-1) starts from a GGUF file's weights
// bitwise, each rank holding its slice, and trains the same losses as one process started from
// the same file (the layout tolerance of dp_equivalence_test.cpp). Named ModelParallel* so that
// the 2-, 4- and 8-rank suites run it.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/mpi/mpi_world.h"
#include "loom/train/init_from.h"
#include "parallel/mpi/synthetic_source.h"
#include "testing/gguf_fixture.h"

using namespace loom;

namespace {

std::string write_source(const comm::Group& world, std::vector<float>& weights) {
  model::ModelConfig c = model::preset("llama-tiny");
  c.vocab_size = 257;  // the fixture's byte-level vocabulary
  model::Decoder m(c);
  m.init_weights(11);
  weights = m.params().to_f32_vector();
  const std::string dir = loom::testing::shared_empty_dir(world, "loom_init_from_mpi");
  const std::string path = dir + "/source.gguf";
  if (world.rank() == 0) {
    std::filesystem::create_directories(dir);
    loom::testing::GgufFixture f;
    f.tokenizer = true;
    loom::testing::gguf_writer_of(m, f).write(path);
  }
  world.barrier();
  return path;
}

train::TrainConfig config(const std::string& from, int64_t pp, int64_t dp, int64_t tp, int zero) {
  return train::parse_train_config(
      "{}",
      {"model.init_from=" + from, "data.dir=unused", "data.seq_len=16", "data.batch_size=8",
       "data.micro_batch_size=" + std::to_string(pp > 1 ? 8 / dp / 2 : 8 / dp), "optim.lr=3e-3", "schedule.steps=4",
       "schedule.warmup_steps=1", "schedule.eval_interval=0", "log.every=1000", "log.progress=off",
       "parallel.pp=" + std::to_string(pp), "parallel.dp=" + std::to_string(dp), "parallel.tp=" + std::to_string(tp),
       "parallel.zero_stage=" + std::to_string(zero), "parallel.bucket_mb=0.01"},
      "<test>", train::init_source_config);
}

}  // namespace

TEST(ModelParallelInitFrom, EveryLayoutStartsFromTheFileAndTrainsAsOneProcess) {
  const comm::Group& world = test_world();
  const int64_t N = world.size();
  std::vector<float> source;
  const std::string path = write_source(world, source);
  loom::testing::SyntheticSource src(257);

  std::vector<double> ref;
  {
    train::Trainer t(config(path, 1, 1, 1, 0), src, loom::testing::quiet());
    ASSERT_EQ(t.full_params().to_f32_vector(), source);
    ref = t.run().losses;
  }
  struct L {
    int64_t pp, dp, tp;
    int zero;
  };
  std::vector<L> layouts = {{1, N, 1, 1}, {1, N, 1, 2}, {1, N, 1, 3}};
  if (N % 2 == 0) layouts.push_back({1, N / 2, 2, 1});
  if (N % 2 == 0) layouts.push_back({2, N / 2, 1, 0});
  if (N % 4 == 0) layouts.push_back({2, N / 4, 2, 1});
  for (const L& l : layouts) {
    const train::TrainConfig cfg = config(path, l.pp, l.dp, l.tp, l.zero);
    const std::string what = "pp=" + std::to_string(l.pp) + " dp=" + std::to_string(l.dp) +
                             " tp=" + std::to_string(l.tp) + " zero=" + std::to_string(l.zero);
    parallel::Mesh mesh(world, cfg.parallel.mesh());
    train::Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh));
    EXPECT_EQ(t.full_params().to_f32_vector(), source) << what;
    const std::vector<double> losses = t.run().losses;
    ASSERT_EQ(losses.size(), ref.size()) << what;
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(losses[i], ref[i], 1e-5 * std::abs(ref[i])) << what << ": loss at step " << i + 1;
  }
}
