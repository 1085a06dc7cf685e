// `loom bench train --nproc N --dp N [--zero S] [--precision fp32|bf16] [--grad-dtype fp32|bf16]
//  [--hosts h1:2,h2:2] [--algorithm A] [--optim adamw|onebit_adam]`:
// data-parallel training steps, how much of the communication hides behind computation, and
// the bytes the dp collectives move per step (halved by bf16 gradients, ~1/30 by 1-bit Adam). Each rank first times the
// same per-rank work alone (dp=1, no communication) under the same CPU contention, then the dp=N steps. comm_ms sums
// the dp collectives' durations from the comm record; exposed_comm_ms is the time the training thread spent blocked
// waiting for them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/loom/bench_train.h"
#include "loom/comm/algorithm.h"
#include "loom/comm/record.h"
#include "loom/comm/world.h"
#include "loom/core/stats.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/model/decoder.h"
#include "loom/model/memory_estimate.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/mesh.h"
#include "loom/train/train_config.h"

namespace loom::cli {

namespace {

struct StepTimes {
  std::vector<double> step_ms, comm_ms, exposed_ms, comm_bytes, wire_bytes, compress_ms;
  std::map<std::string, std::vector<double>> bytes_by_op;  // per timed step
};

StepTimes run_steps(const model::ModelConfig& cfg, const comm::Group& dp, const comm::CommRecord& rec,
                    const parallel::DataParallelPlan& plan, const optim::AdamWConfig& adam, int64_t B, int64_t T,
                    int64_t warmup, int64_t steps, int64_t* model_state_bytes = nullptr) {
  const MemorySnapshot before = cpu_allocator().snapshot();
  model::DecoderOptions dopt = plan.decoder_options({});
  model::Decoder m(cfg, dopt);
  if (dopt.allocate_flat_params) m.init_weights(1234);
  parallel::DataParallel engine(m, dp, adam, plan.options, 1234);
  if (model_state_bytes) {
    const MemorySnapshot after = cpu_allocator().snapshot();
    *model_state_bytes = 0;
    for (MemCategory c : {MemCategory::params, MemCategory::grads, MemCategory::optimizer})
      *model_state_bytes += after[c].current - before[c].current;
  }
  std::mt19937 g(1 + unsigned(dp.rank()));
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(g() % cfg.vocab_size);
  for (auto& t : tgt) t = int32_t(g() % cfg.vocab_size);
  StepTimes st;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    dp.barrier();
    const double t0 = now_seconds();
    engine.take_wait_seconds();
    engine.take_compress_seconds();
    engine.zero_grads();
    engine.set_sync(true);
    m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T * dp.size()));
    engine.finish_grads();
    const double norm = std::sqrt(engine.grad_norm_sq());
    if (norm > 1.0) engine.scale_grads(float(1.0 / norm));
    engine.step(1e-4);
    const double t1 = now_seconds();
    double comm = 0, bytes = 0;
    std::map<std::string, double> by_op;
    for (const auto& e : rec.finished())
      if (e.group == dp.name() && e.t_start >= t0 && e.t_end <= t1 && e.op != "barrier") {
        comm += e.t_end - e.t_start;
        bytes += double(e.bytes);
        by_op[e.op] += double(e.bytes);
      }
    if (i >= warmup) {
      st.step_ms.push_back((t1 - t0) * 1e3);
      st.comm_ms.push_back(comm * 1e3);
      st.comm_bytes.push_back(bytes);
      st.wire_bytes.push_back(double(engine.last_step_wire_bytes()));
      for (const auto& [op, b] : by_op) st.bytes_by_op[op].push_back(b);
      st.exposed_ms.push_back(engine.take_wait_seconds() * 1e3);
      st.compress_ms.push_back(engine.take_compress_seconds() * 1e3);
    }
  }
  return st;
}

}  // namespace

int bench_train_dp(const TrainBenchOptions& o, const CLI::App& app) {
  auto given = [&](const char* name) { return app.count(name) > 0; };
  const std::string& preset = o.model;
  const int64_t B = o.batch, T = o.seq;
  const int64_t steps = given("--steps") ? o.steps : 5, warmup = given("--warmup") ? o.warmup : 1;
  const int zero = int(o.zero);
  const double bucket_mb = o.bucket_mb;
  optim::AdamWConfig adam{1e-4, 0.9, 0.95, 1e-8, 0.1};
  adam.kind = optim::optimizer_from_name(o.optim);
  // 1-bit Adam: the warm-up steps are its full-precision phase, the timed ones compressed.
  adam.freeze_step = given("--freeze-step") ? o.freeze_step : warmup;
  comm::WorldOptions wo;
  wo.algorithm = o.algorithm;
  comm::World world(wo);
  const int N = world.size();
  if (given("--dp") && o.dp != N)
    throw UsageError(str_cat("[bench train] --dp ", o.dp, " but ", N, " ranks are running; use --nproc ", o.dp));
  if (given("--threads")) set_num_threads(int(o.threads));
  model::ModelConfig cfg = model::preset(preset);
  const std::string& precision = o.precision;
  cfg.precision = model::precision_from_name(precision);
  cfg.activation_dtype = train::wire_dtype(o.activation_dtype.empty() ? precision : o.activation_dtype);
  const std::string grad_name = o.grad_dtype.empty() ? precision : o.grad_dtype;  // as parallel.grad_dtype's default
  const DType grad_dtype = grad_name == "bf16" ? DType::bf16 : DType::f32;
  const std::string gather_name = o.gather_dtype.empty() ? precision : o.gather_dtype;  // parallel.gather_dtype's
  const DType gather_dtype = zero == 0 ? DType::f32 : train::wire_dtype(gather_name);
  parallel::check_gather_dtype(gather_dtype, cfg.precision);
  const bool main = world.rank() == 0;
  if (main)
    std::printf(
        "bench train (data parallel): %s, dp=%d, ZeRO-%d, per-rank batch %lld x %lld, %d threads/rank, bucket %.0f MB, "
        "gradients on the wire %s, weight all-gathers %s, saved activations %s\n",
        cfg.summary().c_str(), N, zero, (long long)B, (long long)T, num_threads(), bucket_mb, grad_name.c_str(),
        zero == 0 ? "none" : gather_name.c_str(), dtype_name(cfg.activation_dtype));
  const int64_t n_params = model::ParamLayout(cfg).num_params(), grad_bytes = n_params * 4;
  if (main)
    std::printf("%d ranks on %d host%s; collectives %s (a %s all-reduce runs %s); optimizer %s\n", N,
                world.group().hosts(), world.group().hosts() > 1 ? "s" : "",
                comm::algorithm_name(world.group().algorithm()), format_bytes(grad_bytes).c_str(),
                comm::algorithm_name(world.group().algorithm_for(comm::CollectiveOp::all_reduce, grad_bytes)),
                optim::optimizer_name(adam.kind));
  // Baseline: the same per-rank work with no communication, all ranks at once.
  comm::Group alone = comm::Group::single("alone");
  const StepTimes base =
      run_steps(cfg, alone, world.record(),
                parallel::plan_data_parallel({0, bucket_mb, grad_dtype}, adam.kind, model::ParamLayout(cfg, 1), {}),
                adam, B, T, warmup, steps);
  parallel::Mesh mesh(world.group(), parallel::MeshShape(1, N, 1, 1));
  int64_t state_bytes = 0;
  // Stages 1-2 with 16-bit gathers keep the 16-bit weight replica: product weights take 2 bytes.
  const parallel::DataParallelPlan plan = parallel::plan_data_parallel(
      {zero, bucket_mb, grad_dtype, gather_dtype, parallel::weight_replica_from_name(o.weight_replica)}, adam.kind,
      model::ParamLayout(cfg, N), {N, N});
  const StepTimes dp = run_steps(cfg, mesh.dp(), world.record(), plan, adam, B, T, warmup, steps, &state_bytes);
  const bool replica = plan.weight_replica;
  const parallel::ModelStateBytes& predicted = plan.model_states;
  // Rank 0 reports; medians over its steps (ranks are synchronised by the collectives).
  const double base_ms = median(base.step_ms), dp_ms = median(dp.step_ms);
  const double comm_ms = median(dp.comm_ms), exposed_ms = median(dp.exposed_ms), comm_bytes = median(dp.comm_bytes);
  const double wire_bytes = median(dp.wire_bytes), compress_ms = median(dp.compress_ms);
  if (!main) return 0;
  std::printf("\n%-28s %12s\n", "", "ms (median)");
  std::printf("%-28s %12.1f\n", "step, dp=1 same work", base_ms);
  std::printf("%-28s %12.1f\n", str_cat("step, dp=", N).c_str(), dp_ms);
  std::printf("%-28s %12.1f\n", "communication (total)", comm_ms);
  std::printf("%-28s %12.1f\n", "communication (exposed)", exposed_ms);
  if (adam.kind == optim::OptimizerKind::onebit_adam)
    std::printf("%-28s %12.1f\n", "1-bit compress + decode", compress_ms);
  std::printf("dp collectives' payload per step and rank: %s (gradients in %s):",
              format_bytes(int64_t(comm_bytes)).c_str(), grad_name.c_str());
  for (const auto& [op, v] : dp.bytes_by_op)
    std::printf(" %s %s", op.c_str(), format_bytes(int64_t(median(v))).c_str());
  std::printf("\n");
  std::printf("bytes sent per rank per step (wire, %s; gradients%s): %s\n", optim::optimizer_name(adam.kind),
              zero > 0 ? " and weight all-gathers" : "", format_bytes(int64_t(wire_bytes)).c_str());
  // The communication share of the step: exposed / step; without overlap it would be
  // comm / (compute + comm).
  std::printf("communication share of the step: %.1f%% exposed (%.1f%% if none overlapped)\n",
              dp_ms > 0 ? 100 * exposed_ms / dp_ms : 0.0, 100 * comm_ms / std::max(1e-9, base_ms + comm_ms));
  std::printf("exposed fraction: %.1f%% of communication; dp=%d step is %.2fx the dp=1 step\n",
              comm_ms > 0 ? 100 * exposed_ms / comm_ms : 0.0, N, base_ms > 0 ? dp_ms / base_ms : 0.0);
  std::printf("model states per rank (ZeRO-%d%s): predicted %s, actual %s (params+grads+optimizer)\n", zero,
              replica ? str_cat(", ", gather_name, " weights and fp32 masters").c_str() : "",
              format_bytes(predicted.total()).c_str(), format_bytes(state_bytes).c_str());
  nlohmann::json s = {{"model", preset},
                      {"dp", N},
                      {"zero_stage", zero},
                      {"batch_per_rank", B},
                      {"seq", T},
                      {"threads_per_rank", num_threads()},
                      {"dp1_step_ms", base_ms},
                      {"step_ms", dp_ms},
                      {"comm_ms", comm_ms},
                      {"exposed_comm_ms", exposed_ms},
                      {"comm_bytes", comm_bytes},
                      {"precision", precision},
                      {"grad_dtype", grad_name},
                      {"gather_dtype", zero == 0 ? "none" : gather_name},
                      {"weight_replica", replica},
                      {"activation_dtype", dtype_name(cfg.activation_dtype)},
                      {"optim", optim::optimizer_name(adam.kind)},
                      {"hosts", world.group().hosts()},
                      {"algorithm", comm::algorithm_name(world.group().algorithm())},
                      {"wire_bytes_per_rank", wire_bytes},
                      {"compress_ms", compress_ms},
                      {"comm_share_exposed", dp_ms > 0 ? exposed_ms / dp_ms : 0.0},
                      {"comm_share_unoverlapped", comm_ms / std::max(1e-9, base_ms + comm_ms)},
                      {"exposed_comm_fraction", comm_ms > 0 ? exposed_ms / comm_ms : 0.0},
                      {"tokens_per_s", double(B * T * N) / dp_ms * 1e3},
                      {"model_state_bytes_predicted", predicted.total()},
                      {"model_state_bytes_actual", state_bytes}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
