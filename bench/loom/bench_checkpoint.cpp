// `loom bench checkpoint [--model PRESET] [--steps S] [--every K]`: the training stall of
// synchronous against asynchronous checkpoints (checkpoint.async) on one process, in the same
// invocation: the same run (random tokens) twice, saving every K steps, once writing each
// checkpoint before training goes on and once copying it to memory and writing it on a
// background thread. Reports the stall per checkpoint of each, their ratio, the background
// writes' own time and how much the steps slowed while a write ran.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "bench/loom/bench.h"
#include "loom/core/timer.h"
#include "loom/train/trainer.h"

namespace loom::cli {
namespace {

class RandomTokens final : public train::BatchSource {
 public:
  explicit RandomTokens(int64_t vocab) : vocab_(vocab) {}
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t, int64_t T, int32_t* tok, int32_t* tgt,
                  int32_t*) override {
    std::mt19937_64 rng(uint64_t(step) * 1000003u + uint64_t(first));
    for (int64_t i = 0; i < n * T; ++i) {
      tok[i] = int32_t(rng() % uint64_t(vocab_));
      tgt[i] = int32_t(rng() % uint64_t(vocab_));
    }
  }
  void fill_val(int64_t i, int64_t B, int64_t T, int32_t* tok, int32_t* tgt, int32_t*) override {
    fill_train(-1 - i, 0, B, B, T, tok, tgt, nullptr);
  }
  int64_t vocab_size() const override { return vocab_; }
  bool has_val() const override { return false; }

 private:
  int64_t vocab_;
};

}  // namespace

int bench_checkpoint(const std::vector<std::string>& args) {
  auto app = bench_app("checkpoint",
                       "Trains --steps steps of --model on random tokens twice, saving every --every steps "
                       "synchronously, then with checkpoint.async=true, into --dir. Choose --every so that a write "
                       "fits between two checkpoints; otherwise the async run also waits for the previous write. "
                       "The last line is SUMMARY {json} with sync_stall_s and async_stall_s (per checkpoint), "
                       "stall_ratio (async / sync) and async_write_s.");
  std::string preset = "gpt2-124m", dir;
  int64_t every = 20, steps = 0, B = 1, T = 64, threads = 0;
  app->add_option("--model", preset, "model preset")->type_name("PRESET");
  auto* steps_opt =
      add_run_default_option(*app, "--steps", steps, "training steps per run (default: 3 x --every)", "", positive());
  app->add_option("--every", every, "steps between checkpoints")->type_name("K")->check(positive());
  app->add_option("--batch", B, "sequences per step")->check(positive());
  app->add_option("--seq", T, "tokens per sequence")->check(positive());
  app->add_option("--dir", dir, "where checkpoints go (default: a temporary directory under /tmp, removed afterwards)")
      ->type_name("DIR");
  auto* threads_opt = add_run_default_option(*app, "--threads", threads, "compute threads", "", positive());
  if (auto rc = parse(*app, args)) return *rc;
  if (!steps_opt->count()) steps = 3 * every;
  LOOM_CHECK(steps >= every && every >= 1, "bench", "--steps must be at least --every (>= 1)");
  namespace fs = std::filesystem;
  const bool own_dir = dir.empty();
  if (own_dir) dir = new_temp_dir("loom-bench-checkpoint");
  auto run = [&](bool async) {
    std::vector<std::string> sets = {"model.preset=" + preset,
                                     "data.dir=unused",
                                     str_cat("data.seq_len=", T),
                                     str_cat("data.batch_size=", B),
                                     str_cat("schedule.steps=", steps),
                                     "schedule.eval_interval=0",
                                     "log.every=1000000",
                                     "log.progress=off",
                                     str_cat("checkpoint.every_steps=", every),
                                     "checkpoint.keep_last=2",
                                     str_cat("checkpoint.dir=", dir, async ? "/async" : "/sync"),
                                     str_cat("checkpoint.async=", async ? "true" : "false")};
    if (threads_opt->count()) sets.push_back(str_cat("threads=", threads));
    const train::TrainConfig cfg = train::parse_train_config("{}", sets);
    RandomTokens src(cfg.model.vocab_size);
    train::TrainerOptions o;
    o.overwrite_checkpoints = true;
    o.log = stderr;
    Stopwatch sw;
    train::Trainer t(cfg, src, o);
    train::TrainResult r = t.run();
    return std::pair{r, sw.seconds()};
  };
  std::fprintf(stderr, "[bench] %s, %lld steps of %lld x %lld tokens, a checkpoint every %lld steps, into %s\n",
               preset.c_str(), (long long)steps, (long long)B, (long long)T, (long long)every, dir.c_str());
  const auto [sync, sync_wall] = run(false);
  const auto [async, async_wall] = run(true);
  if (own_dir) fs::remove_all(dir);
  const double n_sync = double(std::max<int64_t>(1, sync.checkpoints)),
               n_async = double(std::max<int64_t>(1, async.checkpoints));
  const double sync_stall = sync.checkpoint_stall_s / n_sync, async_stall = async.checkpoint_stall_s / n_async;
  // Steps: the run's wall time less its checkpoint stalls, per step (the async run's steps share
  // the machine with the background writes).
  const double sync_step = (sync_wall - sync.checkpoint_stall_s) / double(steps);
  const double async_step = (async_wall - async.checkpoint_stall_s) / double(steps);
  std::printf("%-34s %12s %12s\n", "", "synchronous", "async");
  std::printf("%-34s %12lld %12lld\n", "checkpoints", (long long)sync.checkpoints, (long long)async.checkpoints);
  std::printf("%-34s %11.3fs %11.3fs\n", "training stall per checkpoint", sync_stall, async_stall);
  std::printf("%-34s %12s %11.3fs\n", "background write per checkpoint", "-", async.checkpoint_write_s / n_async);
  std::printf("%-34s %11.3fs %11.3fs\n", "step time (stalls excluded)", sync_step, async_step);
  std::printf("%-34s %11.1fs %11.1fs\n", "whole run", sync_wall, async_wall);
  std::printf("async stall / sync stall: %.3f\n", async_stall / sync_stall);
  const nlohmann::json s = {{"model", preset},
                            {"checkpoints", sync.checkpoints},
                            {"sync_stall_s", sync_stall},
                            {"async_stall_s", async_stall},
                            {"stall_ratio", async_stall / sync_stall},
                            {"async_write_s", async.checkpoint_write_s / n_async},
                            {"sync_step_s", sync_step},
                            {"async_step_s", async_step},
                            {"sync_wall_s", sync_wall},
                            {"async_wall_s", async_wall},
                            {"same_losses", sync.losses == async.losses}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
