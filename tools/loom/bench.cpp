// `loom bench <what>`: dispatch to the benchmark named; each lives in its own bench_*.cpp.
#include <cstdio>

#include "tools/loom/commands.h"

namespace loom::cli {

const std::vector<Benchmark>& benchmarks() {
  static const std::vector<Benchmark> list = {
      {"train", "training step time, tokens/s, GFLOP/s and memory (optionally vs PyTorch)", bench_train},
      {"tokenize", "tokenizer encode/decode MB/s on one thread (Tiny Shakespeare by default)", bench_tokenize},
      {"comm", "collective time, algorithm and bus bandwidth per size (nccl-tests style)", bench_comm},
      {"infer", "serving: static vs continuous batching under Poisson load, batch-1 decode vs bandwidth", bench_infer},
      {"serve", "latency percentiles and throughput of a running server under Poisson load", bench_serve},
      {"pipeline", "pipeline bubble and activation memory per stage (GPipe vs 1F1B); partition balance",
       bench_pipeline},
      {"chaos", "kills, hangs and corrupt checkpoints against loom launch --max-restarts; bitwise check, goodput",
       bench_chaos},
      {"checkpoint", "training stall of synchronous vs asynchronous checkpoints (checkpoint.async)", bench_checkpoint},
      {"cascade", "edge/center cascade over an emulated WAN: latency, center load and quality per threshold",
       bench_cascade},
      {"moe", "MoE step split (experts, routing, all-to-all) and tokens/s vs the dense model of equal active size",
       bench_moe},
  };
  return list;
}

int cmd_bench(const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const auto& b : benchmarks()) names.push_back(b.name);
  if (args.empty() && describe_subcommands(names)) return 0;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf("usage: loom bench <what> [options]\n\n");
    for (const auto& b : benchmarks()) std::printf("  %-10s %s\n", b.name.c_str(), b.help.c_str());
    return args.empty() ? 2 : 0;
  }
  for (const auto& b : benchmarks())
    if (b.name == args[0]) return b.run({args.begin() + 1, args.end()});
  throw UsageError("[bench] unknown benchmark '" + args[0] + "' (see loom bench --help)");
}

}  // namespace loom::cli
