// `loom bench train`'s options, shared by the single-process benchmark (bench_train.cpp) and
// the data-parallel one it hands over to (bench_train_dp.cpp).
#pragma once
#include <string>

#include "bench/loom/bench.h"

namespace loom::cli {

struct TrainBenchOptions {
  std::string model = "gpt2-124m", precision = "fp32";
  int64_t batch = 4, seq = 256, steps = 0, warmup = 0, threads = 0;  // steps, warmup: per mode
  // One process.
  int64_t ckpt = 0, rounds = 0, xent_chunk = 0;  // rounds: 1, 2 with --peer; xent_chunk: the model's
  std::string peer, peer_python = "/usr/bin/python3";
  // Data parallel.
  int64_t nproc = 0, dp = 0, zero = 0, freeze_step = 0;  // freeze_step: --warmup
  double bucket_mb = 25.0;
  std::string hosts, grad_dtype, gather_dtype, activation_dtype, algorithm, optim = "adamw";
  std::string weight_replica = "auto";
};

// Data-parallel steps over the ranks of this MPI job; `app` says which options were given.
int bench_train_dp(const TrainBenchOptions& o, const CLI::App& app);

}  // namespace loom::cli
