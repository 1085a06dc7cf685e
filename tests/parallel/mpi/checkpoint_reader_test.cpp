// The weights-only checkpoint reader (model/checkpoint_reader.h, what generate and serve load
// through) against the trainer's own loader: for checkpoints saved by dp=2 ZeRO-3, tp=2 and
// pp=2 on 2 ranks, the whole model the reader returns is bitwise what a trainer resuming on the
// saving layout holds, and what the saving run held when it saved.
#include <gtest/gtest.h>

#include "comm/mpi/mpi_world.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/parallel/mesh.h"
#include "loom/train/trainer.h"
#include "parallel/mpi/synthetic_source.h"
#include "train/train_testing.h"

using namespace loom;
using loom::testing::SyntheticSource;

namespace {

struct ReaderLayout {
  const char* name;
  int pp, dp, tp, zero, micro_batches;
};

train::TrainConfig reader_config(const ReaderLayout& l, const std::string& dir) {
  return train::parse_train_config(
      "{}", {"model.preset=gpt2-tiny", "data.dir=unused", "data.seq_len=16", "data.batch_size=8", "optim.lr=3e-3",
             "schedule.steps=10", "schedule.warmup_steps=2", "schedule.eval_interval=0", "schedule.eval_batches=2",
             "log.every=1000", "log.progress=off", str_cat("parallel.dp=", l.dp), str_cat("parallel.tp=", l.tp),
             str_cat("parallel.pp=", l.pp), str_cat("parallel.zero_stage=", l.zero),
             str_cat("parallel.micro_batches=", l.micro_batches), "checkpoint.dir=" + dir});
}

// Each parameter of `m` (the reader's model) against the same-named one of `flat` in `layout`.
void expect_same_weights(const model::Decoder& m, const model::ParamLayout& layout, const Tensor& flat,
                         const std::string& what) {
  ASSERT_EQ(flat.numel(), layout.total()) << what;
  int64_t compared = 0;
  for (const auto& p : m.layout().params()) {
    if (p.tied_copy) continue;
    const std::vector<float> mine = m.params().slice(p.offset, {p.numel()}).to_f32_vector();
    const std::vector<float> theirs = flat.slice(layout.get(p.name).offset, {p.numel()}).to_f32_vector();
    ASSERT_EQ(mine, theirs) << what << ": " << p.name;
    compared += p.numel();
  }
  EXPECT_EQ(compared, m.num_params()) << what;
}

}  // namespace

TEST(CheckpointReader, WholeWeightsEqualTheTrainersLoaderForDpZero3TpAndPp) {
  const comm::Group& world = test_world();
  if (world.size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string base = loom::testing::shared_empty_dir(world, "loom_ckpt_reader");
  const ReaderLayout layouts[] = {{"dp=2 ZeRO-3", 1, 2, 1, 3, 2}, {"tp=2", 1, 1, 2, 0, 2}, {"pp=2", 2, 1, 1, 0, 4}};
  for (const ReaderLayout& l : layouts) {
    const std::string dir = str_cat(base, "/", l.pp, l.dp, l.tp);
    const train::TrainConfig cfg = reader_config(l, dir);
    parallel::Mesh mesh(world, parallel::MeshShape(l.pp, l.dp, 1, l.tp));
    Tensor saved;  // the saving run's whole weights when it saved (every rank)
    std::unique_ptr<model::ParamLayout> saved_layout;
    {
      SyntheticSource src(cfg.model.vocab_size);
      train::Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh, "", 3));  // 3 steps, checkpoint
      t.run();
      saved = t.full_params();
      saved_layout = std::make_unique<model::ParamLayout>(t.full_layout());
    }
    world.barrier();
    Tensor loaded;  // what the trainer's loader gives the same layout
    std::unique_ptr<model::ParamLayout> loaded_layout;
    {
      SyntheticSource src(cfg.model.vocab_size);
      train::Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh, "auto", 3));
      ASSERT_EQ(t.step(), 3) << l.name;
      loaded = t.full_params();
      loaded_layout = std::make_unique<model::ParamLayout>(t.full_layout());
    }
    // The reader, on each rank alone: the run directory resolves to step 3.
    const std::string path = model::resolve_checkpoint(dir);
    EXPECT_EQ(path, dir + "/step_000003") << l.name;
    model::Decoder whole(model::checkpoint_model_config(path));
    EXPECT_EQ(model::read_checkpoint_weights(path, whole, /*verified=*/true).step, 3) << l.name;
    expect_same_weights(whole, *loaded_layout, loaded, str_cat(l.name, ": reader vs trainer loader"));
    expect_same_weights(whole, *saved_layout, saved, str_cat(l.name, ": reader vs the saving run"));
    world.barrier();
  }
}
