// `loom bench train`: times full training steps (forward, backward, global-norm clip, AdamW)
// on random tokens, reports ms/step, tokens/s, GFLOP/s and peak memory per category against
// the closed-form estimate, and optionally runs the PyTorch peer in the same invocation,
// alternating with loom's runs, to print the speed ratio.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/loom/bench_train.h"
#include "bench/loom/peer_process.h"
#include "loom/comm/launch.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/model/decoder.h"
#include "loom/model/memory_estimate.h"
#include "loom/optim/adamw.h"
#include "loom/optim/schedule.h"
#include "loom/train/train_config.h"

namespace loom::cli {
namespace {

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  s.median = median(std::move(v));
  return s;
}

std::vector<optim::DecaySpan> decay_spans(const model::ParamLayout& layout) {
  std::vector<optim::DecaySpan> spans;
  for (const auto& p : layout.params()) spans.push_back({p.offset, p.offset + p.numel(), p.weight_decay});
  return spans;
}

}  // namespace

int bench_train(const std::vector<std::string>& argv) {
  auto app = bench_app("train",
                       "Times full training steps (forward, backward, clip, AdamW) on random tokens. Data parallel: "
                       "--nproc N --dp N [--zero S] [--bucket-mb M] runs N ranks (via loom launch) and reports "
                       "communication time and the part not hidden behind compute. The last line is SUMMARY {json}.");
  TrainBenchOptions o;
  app->add_option("--model", o.model, "model preset")->type_name("PRESET");
  app->add_option("--batch", o.batch, "sequences per step (per rank)")->type_name("B")->check(positive());
  app->add_option("--seq", o.seq, "tokens per sequence")->type_name("T")->check(positive());
  app->add_option("--steps", o.steps, "timed steps (default 10; data parallel 5)")
      ->type_name("N")
      ->check(positive())
      ->default_str("");
  app->add_option("--warmup", o.warmup, "untimed steps first (default 2; data parallel 1)")
      ->type_name("W")
      ->check(non_negative())
      ->default_str("");
  app->add_option("--threads", o.threads, "compute threads (per rank)")
      ->type_name("K")
      ->check(positive())
      ->default_str("");
  app->add_option("--precision", o.precision,
                  "model.precision: bf16 products (the peer under torch.autocast(\"cpu\", dtype=torch.bfloat16))")
      ->check(one_of({"fp32", "bf16"}));
  app->add_option("--activation-dtype", o.activation_dtype,
                  "model.activation_dtype: what forward keeps for backward (default: --precision)")
      ->check(one_of({"fp32", "bf16", "fp16"}));
  const std::string single = "One process";
  app->add_option("--ckpt", o.ckpt, "activation checkpoint interval (0: off)")
      ->type_name("INTERVAL")
      ->check(non_negative())
      ->group(single);
  app->add_option("--xent-chunk", o.xent_chunk, "rows of logits per chunk of the fused LM head + loss (default 1024)")
      ->check(positive())
      ->default_str("")
      ->group(single);
  app->add_option("--peer", o.peer,
                  "also run bench/peers/torch_gpt2.py (Debian python3-torch) with the same model, shapes and "
                  "threads, alternating --rounds rounds, and print ratios")
      ->check(one_of({"torch"}))
      ->group(single);
  app->add_option("--rounds", o.rounds, "rounds of loom (and the peer) (default 1; 2 with --peer)")
      ->type_name("R")
      ->check(positive())
      ->default_str("")
      ->group(single);
  app->add_option("--peer-python", o.peer_python, "the Python that runs the peer")->type_name("PATH")->group(single);
  const std::string data_parallel = "Data parallel";
  app->add_option("--nproc", o.nproc, "ranks (via loom launch; default: the --hosts slots)")
      ->type_name("N")
      ->check(positive())
      ->default_str("")
      ->group(data_parallel);
  app->add_option("--hosts", o.hosts, "places the ranks on hosts")->type_name("h1:2,h2:2")->group(data_parallel);
  app->add_option("--dp", o.dp, "data-parallel ranks: all of them")
      ->type_name("N")
      ->check(positive())
      ->default_str("")
      ->group(data_parallel);
  app->add_option("--zero", o.zero, "ZeRO stage")->type_name("S")->check(in_range(0, 3))->group(data_parallel);
  app->add_option("--bucket-mb", o.bucket_mb, "gradient bucket size (MB)")
      ->type_name("M")
      ->check(positive())
      ->group(data_parallel);
  app->add_option("--grad-dtype", o.grad_dtype, "gradients on the wire (default: --precision)")
      ->check(one_of({"fp32", "bf16"}))
      ->group(data_parallel);
  app->add_option("--gather-dtype", o.gather_dtype, "ZeRO-1..3 weight all-gathers (default: --precision)")
      ->check(one_of({"fp32", "bf16", "fp16"}))
      ->group(data_parallel);
  app->add_option("--weight-replica", o.weight_replica,
                  "ZeRO-1/2 with 16-bit gathers: keep the weights as the 16-bit replica and the owned fp32 masters "
                  "(parallel.weight_replica; auto: where that takes fewer bytes)")
      ->check(one_of({"auto", "on", "off"}))
      ->group(data_parallel);
  app->add_option("--algorithm", o.algorithm, "the collectives (default: $LOOM_COMM_ALGORITHM or auto)")
      ->check(one_of({"ring", "tree", "hierarchical", "auto", "mpi"}))
      ->group(data_parallel);
  app->add_option("--optim", o.optim, "onebit_adam compresses the gradients after --freeze-step steps")
      ->check(one_of({"adamw", "onebit_adam"}))
      ->group(data_parallel);
  app->add_option("--freeze-step", o.freeze_step, "1-bit Adam's full-precision steps (default: --warmup)")
      ->type_name("K")
      ->check(non_negative())
      ->default_str("")
      ->group(data_parallel);
  if (auto rc = parse(*app, argv)) return *rc;
  auto given = [&](const std::string& name) { return app->count("--" + name) > 0; };
  if ((given("nproc") || given("hosts")) && !comm::launch_env().under_mpi) return relaunch_bench("train", argv);
  const bool data_parallel_run = comm::launch_env().under_mpi || given("dp") || given("zero");
  for (const char* name : {"ckpt", "xent-chunk", "peer", "rounds", "peer-python"})
    if (data_parallel_run && given(name))
      throw UsageError(str_cat("[bench train] --", name, " applies to one process, not to data parallel runs"));
  for (const char* name : {"bucket-mb", "grad-dtype", "algorithm", "optim", "freeze-step"})
    if (!data_parallel_run && given(name))
      throw UsageError(str_cat("[bench train] --", name, " applies to data parallel runs (--nproc N --dp N)"));
  if (data_parallel_run) return bench_train_dp(o, *app);
  const std::string& preset = o.model;
  const int64_t B = o.batch, T = o.seq;
  const int64_t steps = given("steps") ? o.steps : 10, warmup = given("warmup") ? o.warmup : 2;
  const int ckpt = int(o.ckpt);
  const std::string& peer = o.peer;
  const int64_t rounds = given("rounds") ? o.rounds : peer.empty() ? 1 : 2;
  if (given("threads")) set_num_threads(int(o.threads));
  const int threads = num_threads();
  model::ModelConfig cfg = model::preset(preset);
  const std::string& precision = o.precision;
  cfg.precision = model::precision_from_name(precision);
  const std::string act_name = o.activation_dtype.empty() ? precision : o.activation_dtype;
  cfg.activation_dtype = train::wire_dtype(act_name);
  model::DecoderOptions opt;
  opt.activation_checkpoint_interval = ckpt;
  if (given("xent-chunk")) opt.xent_chunk = o.xent_chunk;
  CpuAllocator alloc;
  model::Decoder m(cfg, opt, DType::f32, alloc);
  m.init_weights(1234);
  optim::AdamW adam({1e-4, 0.9, 0.95, 1e-8, 0.1}, 0, m.flat_size(), decay_spans(m.layout()), alloc);
  std::mt19937 g(1);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(g() % cfg.vocab_size);
  for (auto& t : tgt) t = int32_t(g() % cfg.vocab_size);
  const double flops = model::training_flops(cfg, m.num_params(), B, T);

  std::printf("bench train: %s, %lld params, batch %lld x %lld tokens, %d threads, kernels %s%s\n",
              cfg.summary().c_str(), (long long)m.num_params(), (long long)B, (long long)T, threads,
              cpu::hot_kernels_isa().c_str(), ckpt ? str_cat(", checkpoint interval ", ckpt).c_str() : "");
  std::printf("model FLOPs per step: %.1f GFLOP (6*P*tokens + 6*L*T*C*tokens causal attention)\n", flops / 1e9);
  std::printf("matrix products: %s; activations saved for backward in %s\n",
              cfg.precision == model::Precision::bf16
                  ? str_cat(cpu::bf16_product_path(), ", bf16 operands, f32 accumulation").c_str()
                  : "f32 SGEMM",
              ckpt ? "f32 (checkpointed block inputs)" : act_name.c_str());

  // Each step's time inside BLAS matrix products (cpu::gemm_clock), to split the step.
  std::vector<double> loom_gemm_ms;
  cpu::gemm_clock().on = true;
  auto loom_step = [&]() {
    cpu::gemm_clock().ns = 0;
    Stopwatch sw;
    m.zero_grads();
    m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T));
    const double norm = std::sqrt(optim::sum_squares(m.grads().data<float>(), m.flat_size()));
    adam.step(m.params().data<float>(), m.grads().data<float>(), 1e-4, norm > 1.0 ? 1.0 / norm : 1.0);
    const double ms = sw.ms();
    loom_gemm_ms.push_back(double(cpu::gemm_clock().ns.load()) / 1e6);
    return ms;
  };

  std::unique_ptr<PeerProcess> torch_peer;
  if (!peer.empty()) {
    const std::string& py = o.peer_python;
    const std::string script = std::string(LOOM_SOURCE_DIR) + "/bench/peers/torch_gpt2.py";
    torch_peer = std::make_unique<PeerProcess>(std::vector<std::string>{py,
                                                                        script,
                                                                        "--family",
                                                                        model::family_name(cfg.family),
                                                                        "--vocab",
                                                                        std::to_string(cfg.vocab_size),
                                                                        "--n_ctx",
                                                                        std::to_string(cfg.n_ctx),
                                                                        "--n_layer",
                                                                        std::to_string(cfg.n_layer),
                                                                        "--n_head",
                                                                        std::to_string(cfg.n_head),
                                                                        "--n_kv_head",
                                                                        std::to_string(cfg.n_kv_head),
                                                                        "--d_model",
                                                                        std::to_string(cfg.d_model),
                                                                        "--d_ff",
                                                                        std::to_string(cfg.d_ff),
                                                                        "--batch",
                                                                        std::to_string(B),
                                                                        "--seq",
                                                                        std::to_string(T),
                                                                        "--threads",
                                                                        std::to_string(threads),
                                                                        "--precision",
                                                                        precision});
    std::string ready = torch_peer->read_until("READY ");
    std::printf("peer: PyTorch eager%s (%s)\n",
                precision == "bf16" ? " under torch.autocast(\"cpu\", dtype=torch.bfloat16)" : "", ready.c_str());
  }

  std::vector<double> loom_ms, peer_ms;
  for (int64_t r = 0; r < rounds; ++r) {
    for (int64_t i = 0; i < (r == 0 ? warmup : 0); ++i) loom_step();
    for (int64_t i = 0; i < steps; ++i) {
      double ms = loom_step();
      loom_ms.push_back(ms);
      std::printf("  round %lld loom step %lld: %.1f ms\n", (long long)r + 1, (long long)i + 1, ms);
      std::fflush(stdout);
    }
    if (torch_peer) {
      if (r == 0 && warmup > 0) {
        torch_peer->send_line("run " + std::to_string(warmup));
        torch_peer->read_until("TIMES ");
      }
      torch_peer->send_line("run " + std::to_string(steps));
      std::istringstream is(torch_peer->read_until("TIMES "));
      double ms;
      int64_t i = 0;
      while (is >> ms) {
        peer_ms.push_back(ms);
        std::printf("  round %lld torch step %lld: %.1f ms\n", (long long)r + 1, (long long)++i, ms);
      }
      std::fflush(stdout);
    }
  }
  if (torch_peer) torch_peer->send_line("quit");

  const Stats ls = stats_of(loom_ms), ps = stats_of(peer_ms);
  const double tokens = double(B * T);
  std::printf("\n%-8s %10s %10s %10s %12s %10s\n", "", "ms median", "min", "max", "tokens/s", "GFLOP/s");
  std::printf("%-8s %10.1f %10.1f %10.1f %12.1f %10.1f\n", "loom", ls.median, ls.min, ls.max, tokens / ls.median * 1e3,
              flops / ls.median / 1e6);
  if (!peer_ms.empty())
    std::printf("%-8s %10.1f %10.1f %10.1f %12.1f %10.1f\n", "torch", ps.median, ps.min, ps.max,
                tokens / ps.median * 1e3, flops / ps.median / 1e6);
  const double speedup = peer_ms.empty() ? 0.0 : ps.median / ls.median;
  if (!peer_ms.empty()) std::printf("speedup (torch ms / loom ms, medians): %.2fx\n", speedup);
  // The timed steps' matrix-product share (the warm-up steps' entries come first and are skipped
  // by taking the last loom_ms.size()).
  const std::vector<double> gemm_ms(loom_gemm_ms.end() - long(loom_ms.size()), loom_gemm_ms.end());
  const double gemm_med = median(gemm_ms);
  std::printf("loom's step: %.1f ms in BLAS matrix products (%.1f%%), %.1f ms in everything else (medians)\n", gemm_med,
              100 * gemm_med / ls.median, ls.median - gemm_med);

  // Memory: measured peaks per category against the closed-form estimate.
  const auto snap = alloc.snapshot();
  const auto est = model::estimate_training_memory(cfg, m.num_params(), B, T, ckpt, opt.xent_chunk);
  std::printf("\n%-12s %14s %14s %8s\n", "memory", "peak", "estimate", "ratio");
  auto row = [&](const char* name, int64_t peak, int64_t e) {
    std::printf("%-12s %14s %14s %8.3f\n", name, format_bytes(peak).c_str(), format_bytes(e).c_str(),
                e ? double(peak) / double(e) : 0.0);
  };
  row("params", snap[MemCategory::params].peak, est.params);
  row("grads", snap[MemCategory::grads].peak, est.grads);
  row("optimizer", snap[MemCategory::optimizer].peak, est.optimizer);
  row("activations", snap[MemCategory::activations].peak, est.activations);
  row("workspace", snap[MemCategory::workspace].peak, est.workspace);
  row("total", snap.total.peak, est.total());

  nlohmann::json s = {{"model", preset},
                      {"batch", B},
                      {"seq", T},
                      {"threads", threads},
                      {"precision", precision},
                      {"checkpoint_interval", ckpt},
                      {"activation_dtype", ckpt ? "fp32" : act_name},
                      {"isa", cpu::hot_kernels_isa()},
                      {"loom_ms_median", ls.median},
                      {"loom_ms_min", ls.min},
                      {"loom_ms_max", ls.max},
                      {"tokens_per_s", tokens / ls.median * 1e3},
                      {"loom_gemm_ms_median", gemm_med},
                      {"gflops", flops / ls.median / 1e6},
                      {"peak_bytes", snap.total.peak},
                      {"estimate_bytes", est.total()},
                      {"peak_activation_bytes", snap[MemCategory::activations].peak},
                      {"estimate_activation_bytes", est.activations}};
  if (!peer_ms.empty()) {
    s["peer"] = "torch";
    s["peer_ms_median"] = ps.median;
    s["speedup"] = speedup;
  } else {
    s["peer_ms_median"] = nullptr;
    s["speedup"] = nullptr;
  }
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
