// The data-parallel plan and the ZeRO memory formulas of data_parallel_plan.h.
#include "loom/parallel/data_parallel_plan.h"

#include "loom/core/error.h"

namespace loom::parallel {

bool keeps_weight_replica(const DataParallelOptions& opt, optim::OptimizerKind optimizer,
                          const model::ParamLayout& layout, int dp_size, int expert_dp_size) {
  check_weight_replica(opt, optimizer);
  if (!weight_replica_possible(opt, optimizer) || opt.weight_replica == WeightReplica::off) return false;
  if (opt.weight_replica == WeightReplica::on) return true;
  double replica = 0, fp32_copy = 0;
  for (const auto& p : layout.params()) {
    const double n = double(p.numel());
    replica += (p.product_operand ? 2 : 4) * n + 4 * n / (p.expert >= 0 ? expert_dp_size : dp_size);
    fp32_copy += 4 * n;
  }
  return replica < fp32_copy;
}

model::DecoderOptions decoder_options_for(model::DecoderOptions base, int zero_stage, int dp_size,
                                          bool weight_replica) {
  LOOM_CHECK(zero_stage >= 0 && zero_stage <= 3, "config", "parallel.zero_stage=", zero_stage, " must be 0, 1, 2 or 3");
  base.unit_align = dp_size;
  base.allocate_flat_grads = zero_stage < 2;
  base.allocate_flat_params = zero_stage < 3 && !weight_replica;
  return base;
}

ModelStateBytes zero_model_state_bytes(int64_t P, int stage, int N, int64_t replica16) {
  ModelStateBytes b;
  b.params = stage >= 3 ? 4 * P / N : 4 * P;
  b.grads = stage >= 2 ? 4 * P / N : 4 * P;
  b.optimizer = stage >= 1 ? 8 * P / N : 8 * P;
  if (replica16 >= 0 && (stage == 1 || stage == 2)) {
    b.params = 2 * replica16 + 4 * (P - replica16);
    b.optimizer = 12 * P / N;
  }
  return b;
}

ModelStateBytes layout_model_state_bytes(const model::ParamLayout& layout, int stage, int dp_size, int expert_dp_size,
                                         bool replica) {
  int64_t dense = 0, experts = 0, dense16 = 0, experts16 = 0;
  for (const auto& p : layout.params()) {
    (p.expert >= 0 ? experts : dense) += p.numel();
    if (p.product_operand) (p.expert >= 0 ? experts16 : dense16) += p.numel();
  }
  ModelStateBytes b = zero_model_state_bytes(dense, stage, dp_size, replica ? dense16 : -1);
  const ModelStateBytes e = zero_model_state_bytes(experts, stage, expert_dp_size, replica ? experts16 : -1);
  b.params += e.params;
  b.grads += e.grads;
  b.optimizer += e.optimizer;
  return b;
}

int64_t onebit_error_bytes(int64_t P, int N) { return N > 1 ? 4 * (P + P / N) : 0; }

model::DecoderOptions DataParallelPlan::decoder_options(model::DecoderOptions base) const {
  return decoder_options_for(base, options.zero_stage, ranks.dp_size, weight_replica);
}

DataParallelPlan plan_data_parallel(const DataParallelOptions& opt, optim::OptimizerKind optimizer,
                                    const model::ParamLayout& layout, DataParallelRanks ranks) {
  DataParallelPlan plan;
  plan.options = opt;
  plan.optimizer = optimizer;
  plan.ranks = ranks;
  plan.weight_replica = keeps_weight_replica(opt, optimizer, layout, ranks.dp_size, ranks.expert_dp_size);
  plan.model_states =
      layout_model_state_bytes(layout, opt.zero_stage, ranks.dp_size, ranks.expert_dp_size, plan.weight_replica);
  // 1-bit Adam refuses expert parallelism, so its group is the experts' one as much as the
  // dense parameters'.
  if (optimizer == optim::OptimizerKind::onebit_adam)
    plan.model_states.optimizer += onebit_error_bytes(layout.num_params(), ranks.expert_dp_size);
  return plan;
}

}  // namespace loom::parallel
