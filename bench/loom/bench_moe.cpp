// `loom bench moe [--nproc N --ep E] [--model PRESET] [--batch B] [--seq T]`: Mixture-of-Experts
// training steps (forward, backward, clip, AdamW) on random tokens, split into the experts' MLPs,
// routing (router, top-k, grouping, gathers, combines), the all-to-all exchanges of expert
// parallelism (their whole time from the comm record, and the part the training thread waited
// for), and the dense rest; the expert load and dropped tokens; and, in the same invocation on
// the same ranks, the dense model with the same active parameters (d_ff = top_k * expert_d_ff
// + the shared experts' width, data-parallel over all ranks) for the tokens/s ratio.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "bench/loom/bench.h"
#include "loom/comm/launch.h"
#include "loom/comm/record.h"
#include "loom/comm/world.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/data/dataset.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/decoder.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/expert_parallel.h"
#include "loom/parallel/mesh.h"
#include "loom/parallel/model_gather.h"
#include "loom/train/checkpoint.h"

namespace loom::cli {
namespace {

struct Timed {
  std::vector<double> step, route, expert, a2a, a2a_exposed, dp_exposed, load, dropped;
};

Timed run(const model::ModelConfig& cfg, const parallel::Mesh& mesh, const comm::CommRecord& rec, int zero, int64_t B,
          int64_t T, int64_t warmup, int64_t steps, const std::string& checkpoint = "",
          const std::string& data_dir = "") {
  const int64_t data = mesh.data_size(), ep = mesh.shape().size(parallel::Dim::ep);
  model::ModelSlice slice;
  slice.ep = ep;
  slice.ep_rank = mesh.coord().ep;
  const auto ranks = parallel::Layout{.dp = mesh.shape().size(parallel::Dim::dp), .ep = ep}.data_parallel_ranks();
  const optim::AdamWConfig adam{1e-4, 0.9, 0.95, 1e-8, 0.1};
  const parallel::DataParallelPlan plan = parallel::plan_data_parallel(
      {zero, 25.0, DType::f32}, adam.kind, model::ParamLayout(cfg, ranks.dp_size, slice), ranks);
  model::DecoderOptions dopt = plan.decoder_options({});
  dopt.slice = slice;
  model::Decoder m(cfg, dopt);
  std::unique_ptr<parallel::ExpertParallelExchange> exchange;
  if (ep > 1) {
    exchange = std::make_unique<parallel::ExpertParallelExchange>(mesh.ep());
    m.set_expert_parallel(exchange.get());
  }
  if (dopt.allocate_flat_params) m.init_weights(1234);
  if (!checkpoint.empty()) {  // this rank's slice of the trained weights (and balancing bias)
    model::Decoder whole(cfg);
    train::load_checkpoint_weights(checkpoint, whole);
    parallel::slice_whole_params(whole.layout(), whole.params(), m.layout(), m.params());
    if (whole.router_bias().defined()) {
      const Tensor& b = whole.router_bias();
      m.set_router_bias(std::vector<float>(b.data<float>(), b.data<float>() + b.numel()));
    }
  }
  parallel::DataParallel engine(m, mesh.data(), adam, plan.options, 1234, mesh.dp());
  std::mt19937 g(1 + unsigned(mesh.data_index()));
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(g() % cfg.vocab_size);
  for (auto& t : tgt) t = int32_t(g() % cfg.vocab_size);
  if (!data_dir.empty()) {  // each rank its own validation batch
    data::DatasetOptions o;
    o.model_vocab = cfg.vocab_size;
    const auto val = data::TokenDataset::open_split(data_dir, "val", o);
    val.fill_eval_batch(mesh.data_index(), B, T, tok.data(), tgt.data());
  }
  Timed out;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    mesh.world().barrier();
    m.take_moe_times();
    m.reset_moe_stats();
    engine.take_wait_seconds();
    if (exchange) exchange->take_wait_seconds();
    const double t0 = now_seconds();
    engine.zero_grads();
    engine.set_sync(true);
    m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T * data));
    engine.finish_grads();
    const double norm = std::sqrt(engine.grad_norm_sq());
    if (norm > 1.0) engine.scale_grads(float(1.0 / norm));
    engine.step(1e-4);
    const double t1 = now_seconds();
    if (i < warmup) continue;
    double a2a = 0;
    if (exchange)
      for (const auto& e : rec.finished())
        if (e.group == exchange->group().name() && e.t_start >= t0 && e.t_end <= t1) a2a += e.t_end - e.t_start;
    const model::MoeTimes mt = m.take_moe_times();
    out.step.push_back((t1 - t0) * 1e3);
    out.route.push_back(mt.route_s * 1e3);
    out.expert.push_back(mt.expert_s * 1e3);
    out.a2a.push_back(a2a * 1e3);
    out.a2a_exposed.push_back(exchange ? exchange->take_wait_seconds() * 1e3 : 0.0);
    out.dp_exposed.push_back(engine.take_wait_seconds() * 1e3);
    // Loads over every rank's tokens: the worst MoE block's max/mean, and the dropped share.
    std::vector<model::MoeLayerStats> stats = m.moe_stats();
    if (!stats.empty()) {
      const std::vector<double> v = model::pack_moe_stats(cfg, stats);
      Tensor t = Tensor::from_vector<double>(v, {int64_t(v.size())});
      mesh.data().all_reduce(t);
      model::unpack_moe_stats(cfg, t.data<double>(), stats);
      const model::MoeSummary s = model::summarize_moe_stats(stats);
      out.load.push_back(s.worst_load);
      out.dropped.push_back(s.dropped_fraction);
    }
  }
  return out;
}

double med(const std::vector<double>& v) { return v.empty() ? 0.0 : median(v); }

}  // namespace

int bench_moe(const std::vector<std::string>& argv) {
  auto app = bench_app("moe",
                       "Times MoE training steps on random tokens and the dense model of equal active parameters. "
                       "The last line is SUMMARY {json} with a2a_ms, exposed_a2a_ms, tokens_per_s, "
                       "dense_tokens_per_s and load_max_over_mean.");
  std::string preset = "llama-moe-tiny", checkpoint_dir, data_dir;
  int64_t B = 4, T = 0, steps = 5, warmup = 1, threads = 0, nproc = 0, ep = 1;
  int zero = 0;
  double capacity_factor = 0, aux_loss_coef = 0;
  app->add_option("--model", preset, "a MoE preset (llama-moe-60m: 8 experts, top-2)")->type_name("PRESET");
  app->add_option("--batch", B, "sequences per rank and step")->check(positive());
  app->add_option("--seq", T, "tokens per sequence (default: 128, at most the context)")
      ->check(positive())
      ->default_str("");
  app->add_option("--steps", steps, "timed steps")->check(positive());
  app->add_option("--warmup", warmup, "untimed steps first")->check(non_negative());
  app->add_option("--threads", threads, "compute threads per rank")->type_name("K")->check(positive())->default_str("");
  app->add_option("--nproc", nproc, "ranks (via loom launch)")->type_name("N")->check(positive())->default_str("");
  app->add_option("--ep", ep, "experts split over E ranks; dp = N / E")->type_name("E")->check(positive());
  app->add_option("--zero", zero, "ZeRO stage")->type_name("Z")->check(in_range(0, 3));
  app->add_option("--capacity-factor", capacity_factor, "override the preset's model.moe.capacity_factor")
      ->type_name("F")
      ->check(non_negative())
      ->default_str("");
  app->add_option("--aux-loss-coef", aux_loss_coef, "override the preset's model.moe.router_aux_loss_coef")
      ->type_name("A")
      ->check(non_negative())
      ->default_str("");
  app->add_option("--checkpoint", checkpoint_dir,
                  "the MoE model and weights of a trained checkpoint instead of a preset (a trained router's load, "
                  "not a random one's; the dense peer stays random)")
      ->type_name("DIR");
  app->add_option("--data", data_dir, "tokens from DIR/val.bin (loom prepare) instead of random ones")
      ->type_name("DIR");
  if (auto rc = parse(*app, argv)) return *rc;
  auto given = [&](const char* name) { return app->count(name) > 0; };
  if (given("--nproc") && !comm::launch_env().under_mpi) return relaunch_bench("moe", argv);
  comm::World world;
  const int N = world.size();
  if (ep < 1 || N % ep != 0)
    throw UsageError(str_cat("[bench moe] --ep ", ep, " does not divide the ", N, " ranks running (--nproc)"));
  if (given("--threads")) set_num_threads(int(threads));
  const std::string checkpoint = checkpoint_dir.empty() ? "" : model::resolve_checkpoint(checkpoint_dir);
  model::ModelConfig cfg = checkpoint.empty() ? model::preset(preset) : model::checkpoint_model_config(checkpoint);
  if (!cfg.moe.enabled())
    throw UsageError("[bench moe] --model " + cfg.name + " is dense; use a MoE preset (llama-moe-tiny, llama-moe-60m)");
  if (given("--capacity-factor")) cfg.moe.capacity_factor = capacity_factor;
  if (given("--aux-loss-coef")) cfg.moe.router_aux_loss_coef = aux_loss_coef;
  cfg.validate();
  model::check_expert_parallel(cfg, ep);
  if (!given("--seq")) T = std::min<int64_t>(128, cfg.n_ctx);
  if (T > cfg.n_ctx) throw UsageError(str_cat("[bench moe] --seq ", T, " exceeds the model's context ", cfg.n_ctx));
  if (!checkpoint.empty() && zero >= 3) throw UsageError("[bench moe] --checkpoint needs --zero 0, 1 or 2");
  // The dense model a token costs the same in: one MLP as wide as its top_k experts and the
  // shared ones.
  model::ModelConfig dense = cfg;
  dense.moe = {};
  dense.d_ff = cfg.moe.top_k * cfg.expert_d_ff() + cfg.shared_d_ff();
  dense.name = cfg.name + "-dense";
  const bool main = world.rank() == 0;
  const int64_t dp = N / ep;
  if (main)
    std::printf(
        "bench moe: %s\n  %d ranks: dp=%lld x ep=%lld, ZeRO-%d, per-rank batch %lld x %lld, %d thread(s)/rank\n"
        "  dense peer: %s\n",
        cfg.summary().c_str(), N, (long long)dp, (long long)ep, zero, (long long)B, (long long)T, num_threads(),
        dense.summary().c_str());
  parallel::Mesh moe_mesh(world.group(), parallel::MeshShape(1, dp, ep, 1));
  const Timed moe = run(cfg, moe_mesh, world.record(), zero, B, T, warmup, steps, checkpoint, data_dir);
  parallel::Mesh dense_mesh(world.group(), parallel::MeshShape(1, N, 1, 1));
  const Timed den = run(dense, dense_mesh, world.record(), zero, B, T, warmup, steps, "", data_dir);
  // Rank 0's figures are printed; the exposed share is also given over all ranks, since the
  // rank whose experts finish first is the one that waits inside the exchanges.
  Tensor a2a_sums = Tensor::from_vector<double>({med(moe.a2a), med(moe.a2a_exposed)}, {2});
  world.group().all_reduce(a2a_sums);
  const double a2a_all = a2a_sums.data<double>()[0], exposed_all = a2a_sums.data<double>()[1];
  if (!main) return 0;
  const double step = med(moe.step), dense_step = med(den.step), expert = med(moe.expert), route = med(moe.route);
  const double a2a = med(moe.a2a), exposed = med(moe.a2a_exposed), dp_exposed = med(moe.dp_exposed);
  const double rest = std::max(0.0, step - expert - route - exposed - dp_exposed);
  const double tokens = double(B * T * N);
  std::printf("\n%-36s %10s\n", "", "ms (median)");
  std::printf("%-36s %10.1f\n", "MoE step", step);
  std::printf("%-36s %10.1f\n", "  experts' MLPs (fwd + bwd)", expert);
  std::printf("%-36s %10.1f\n", "  routing, grouping, combining", route);
  std::printf("%-36s %10.1f\n", "  all-to-all exposed", exposed);
  std::printf("%-36s %10.1f\n", "  dp gradient communication exposed", dp_exposed);
  std::printf("%-36s %10.1f\n", "  dense part (attention, norms, head)", rest);
  std::printf("%-36s %10.1f\n", "all-to-all total (comm record)", a2a);
  std::printf("%-36s %10.1f\n", "dense model step", dense_step);
  std::printf("\nMoE %.0f tokens/s, dense %.0f tokens/s: MoE step %.2fx the dense step\n", tokens / step * 1e3,
              tokens / dense_step * 1e3, step / dense_step);
  std::printf("expert load max/mean %.2f (worst block), dropped %.2f%% of choices (capacity factor %g)\n",
              med(moe.load), 100 * med(moe.dropped), cfg.moe.capacity_factor);
  if (ep > 1)
    std::printf("all-to-all exposed: %.1f%% of its time (rank 0), %.1f%% over all ranks\n",
                a2a > 0 ? 100 * exposed / a2a : 0.0, a2a_all > 0 ? 100 * exposed_all / a2a_all : 0.0);
  nlohmann::json s = {{"model", cfg.name},
                      {"checkpoint", checkpoint},
                      {"data", data_dir},
                      {"ranks", N},
                      {"dp", dp},
                      {"ep", ep},
                      {"zero_stage", zero},
                      {"batch_per_rank", B},
                      {"seq", T},
                      {"threads_per_rank", num_threads()},
                      {"step_ms", step},
                      {"expert_ms", expert},
                      {"route_ms", route},
                      {"dense_part_ms", rest},
                      {"a2a_ms", a2a},
                      {"exposed_a2a_ms", exposed},
                      {"exposed_a2a_share_all_ranks", a2a_all > 0 ? exposed_all / a2a_all : 0.0},
                      {"exposed_dp_ms", dp_exposed},
                      {"dense_step_ms", dense_step},
                      {"tokens_per_s", tokens / step * 1e3},
                      {"dense_tokens_per_s", tokens / dense_step * 1e3},
                      {"moe_over_dense", step / dense_step},
                      {"load_max_over_mean", med(moe.load)},
                      {"dropped_fraction", med(moe.dropped)},
                      {"capacity_factor", cfg.moe.capacity_factor}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
