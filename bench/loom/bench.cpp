// `loom bench <what>`: the registry and dispatch to the benchmark named (each lives in its own
// bench_*.cpp), and the helpers they share: bench_app, relaunch_bench, one_way_seconds.
#include "bench/loom/bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"

namespace loom::cli {

const std::vector<Benchmark>& benchmarks() {
  static const std::vector<Benchmark> list = {
      {"train", "training step time, tokens/s, GFLOP/s and memory (optionally vs PyTorch)", bench_train},
      {"finetune", "fine-tuning tokens/s and peak memory per rank of a real model, one rank and dp, vs PyTorch",
       bench_finetune},
      {"tokenize", "tokenizer encode/decode MB/s on one thread (Tiny Shakespeare by default)", bench_tokenize},
      {"comm", "collective time, algorithm and bus bandwidth per size (nccl-tests style)", bench_comm},
      {"infer", "serving: static vs continuous batching under Poisson load, batch-1 decode vs bandwidth", bench_infer},
      {"serve", "latency percentiles and throughput of a running server under Poisson load", bench_serve},
      {"pipeline",
       "pipeline bubble, activation memory and step time per schedule (GPipe, 1F1B, interleaved); partition balance",
       bench_pipeline},
      {"chaos", "kills, hangs and corrupt checkpoints against loom launch --max-restarts; bitwise check, goodput",
       bench_chaos},
      {"checkpoint", "training stall of synchronous vs asynchronous checkpoints (checkpoint.async)", bench_checkpoint},
      {"cascade", "edge/center cascade over an emulated WAN: latency, center load and quality per threshold",
       bench_cascade},
      {"moe", "MoE step split (experts, routing, all-to-all) and tokens/s vs the dense model of equal active size",
       bench_moe},
      {"guards", "replays recorded loss curves through the spike and divergence guards (choosing their defaults)",
       bench_guards},
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

std::unique_ptr<CLI::App> bench_app(const std::string& name, const std::string& details) {
  std::string description;
  for (const Benchmark& b : benchmarks())
    if (b.name == name) description = b.help + ".";
  if (!details.empty()) description += (description.empty() ? "" : "\n") + details;
  return new_app("bench " + name, description);
}

std::string new_temp_dir(const std::string& prefix) {
  std::string path = "/tmp/" + prefix + "-XXXXXX";
  LOOM_CHECK(mkdtemp(path.data()), "bench", "cannot create a directory under /tmp");
  return path;
}

namespace {

// `args` without the named options (each "--name value" or "--name=value").
std::vector<std::string> without_options(const std::vector<std::string>& args, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const auto& n : names) {
      if (args[i] == n) {
        ++i;  // and its value
        drop = true;
      } else if (args[i].rfind(n + "=", 0) == 0) {
        drop = true;
      }
      if (drop) break;
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

// The value of option `name` in args ("--name value" or "--name=value"), or "".
std::string option_value(const std::vector<std::string>& args, const std::string& name) {
  std::string v;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind(name + "=", 0) == 0) v = args[i].substr(name.size() + 1);
  }
  return v;
}

}  // namespace

double one_way_seconds(const comm::Group& g, int peer, int64_t bytes, int iters) {
  Tensor buf = Tensor::zeros({std::max<int64_t>(1, bytes)}, DType::u8, MemCategory::comm);
  Tensor out = Tensor::zeros({1}, DType::f64);
  g.barrier();
  if (g.rank() == 0 || g.rank() == peer) {
    std::vector<double> rt;
    for (int i = 0; i < iters + 2; ++i) {
      Stopwatch sw;
      if (g.rank() == 0) {
        g.send(buf, peer);
        g.recv(buf, peer);
      } else {
        g.recv(buf, 0);
        g.send(buf, 0);
      }
      if (i >= 2) rt.push_back(sw.seconds());
    }
    out.data<double>()[0] = median(std::move(rt)) / 2;
  }
  g.broadcast(out, 0);
  return out.data<double>()[0];
}

int relaunch_bench(const std::string& bench, const std::vector<std::string>& args) {
  const std::string hosts = option_value(args, "--hosts");
  std::string nproc = option_value(args, "--nproc");
  if (nproc.empty()) nproc = std::to_string(comm::slots_in_hosts(hosts));
  std::vector<std::string> launch = {"--nproc", nproc};
  if (!hosts.empty()) launch.insert(launch.end(), {"--hosts", hosts});
  launch.insert(launch.end(), {"--", "bench", bench});
  for (const auto& s : without_options(args, {"--nproc", "--hosts"})) launch.push_back(s);
  return cmd_launch(launch);
}

}  // namespace loom::cli
