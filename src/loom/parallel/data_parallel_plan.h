// plan_data_parallel: where a configuration's data-parallel choices (ZeRO stage, wire types,
// weight replica, optimizer) meet a model's layout and rank counts, once, for the trainer, the
// benchmarks and the planner alike; and the ZeRO memory formulas it predicts with. Needs no
// group and no model, only the layout.
#pragma once
#include <cstdint>

#include "loom/model/decoder.h"
#include "loom/model/param_layout.h"
#include "loom/optim/adamw.h"
#include "loom/parallel/data_parallel_options.h"
#include "loom/parallel/layout.h"

namespace loom::parallel {

// Whether stages 1-2 keep the 16-bit weight replica for a model laid out as `layout` (its units
// sharded over `dp_size` ranks, the expert units over `expert_dp_size`); the model then has no
// flat parameter buffer. Needs 16-bit gathers (throws for weight_replica=on without them); auto
// keeps it where the replica (2 bytes per product weight, 4 per other) and the owned fp32
// masters (4 bytes per parameter over the unit's group) take fewer bytes than the fp32 copy of
// every weight: on 3 or more ranks, for most models.
bool keeps_weight_replica(const DataParallelOptions& opt, optim::OptimizerKind optimizer,
                          const model::ParamLayout& layout, int dp_size, int expert_dp_size);
// Decoder options a given layout needs (unit alignment, which flat buffers to allocate);
// `weight_replica` is keeps_weight_replica's answer.
model::DecoderOptions decoder_options_for(model::DecoderOptions base, int zero_stage, int dp_size,
                                          bool weight_replica = false);

// Model-state bytes per rank predicted by the ZeRO formulas (fp32 Adam: 4 + 4 + 8 bytes per
// parameter; stage 1: 8P + 8P/N; 2: 4P + 12P/N; 3: 16P/N). Padding excluded.
// `replica16` >= 0: stages 1-2 keep the weight replica (keeps_weight_replica), of which that many
// parameters (the product operands) are 16-bit and the rest f32, and the fp32 masters of the
// rank's chunks count with the optimizer: weights 2P16 + 4(P - P16), gradients (fp32, so
// micro-batches accumulate exactly) 4P at stage 1 and 4P/N at 2, optimizer 12P/N. With every
// weight a product operand that is Megatron-LM's distributed optimizer's bf16 accounting:
// 6P + 12P/N at stage 1, 2P + 16P/N at 2.
struct ModelStateBytes {
  int64_t params = 0, grads = 0, optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};
ModelStateBytes zero_model_state_bytes(int64_t n_params, int zero_stage, int dp_size, int64_t replica16 = -1);
// The same for a model laid out as `layout`: its dense parameters sharded over `dp_size` ranks,
// its experts over `expert_dp_size`, and with the replica (keeps_weight_replica) its product
// weights in 16 bits.
ModelStateBytes layout_model_state_bytes(const model::ParamLayout& layout, int zero_stage, int dp_size,
                                         int expert_dp_size, bool replica);
// 1-bit Adam's error feedback per rank (optim.name=onebit_adam, dp_size > 1; optimizer state on
// top of the ZeRO formulas): a worker error per parameter and a server error per parameter of
// the rank's chunk, f32. Padding excluded.
int64_t onebit_error_bytes(int64_t n_params, int dp_size);

// What a data-parallel run of one layout builds, and what the formulas predict of it.
struct DataParallelPlan {
  DataParallelOptions options;  // for DataParallel's constructor
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;
  DataParallelRanks ranks;
  bool weight_replica = false;  // keeps_weight_replica's answer
  // Model-state bytes per rank: layout_model_state_bytes, plus 1-bit Adam's error feedback.
  ModelStateBytes model_states;
  // The decoder options to build the model with (decoder_options_for).
  model::DecoderOptions decoder_options(model::DecoderOptions base) const;
};

// Throws "[config] ..." where the options cannot hold (weight_replica=on without 16-bit gathers).
DataParallelPlan plan_data_parallel(const DataParallelOptions& opt, optim::OptimizerKind optimizer,
                                    const model::ParamLayout& layout, DataParallelRanks ranks);

}  // namespace loom::parallel
