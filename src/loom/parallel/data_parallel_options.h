// DataParallelOptions and the rules a configuration must meet before any rank starts (which
// gather types a precision allows, when the weight replica is possible), apart from
// DataParallel itself so that parsing a configuration needs neither a model nor a group.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "loom/core/dtype.h"
#include "loom/model/config.h"
#include "loom/optim/adamw.h"
#include "loom/optim/offload_target.h"

namespace loom::parallel {

// parallel.weight_replica: stages 1-2 with 16-bit gathers keep the weights as the gathered
// 16-bit replica and the fp32 masters of the rank's own chunks only (on), or the whole fp32 copy
// (off); auto: the replica where it takes fewer bytes (keeps_weight_replica).
enum class WeightReplica { auto_choice, on, off };
// "auto", "on", "off"; the inverse throws "[config] parallel.weight_replica must be ...".
const char* weight_replica_name(WeightReplica r);
WeightReplica weight_replica_from_name(const std::string& name);

// "fp32", "bf16", "fp16": a wire type as the configuration names it (parallel.grad_dtype,
// parallel.gather_dtype).
const char* wire_dtype_name(DType t);
// The DType a wire type's name stands for; nullopt for any other name.
std::optional<DType> wire_dtype_from_name(std::string_view name);

struct DataParallelOptions {
  int zero_stage = 0;
  double bucket_mb = 25.0;
  // The gradients' type on the wire (parallel.grad_dtype): f32, or bf16 (half the bytes; each
  // bucket or staged unit is rounded to bf16, summed in bf16 with every partial sum rounded, and
  // widened back into the f32 gradients).
  DType grad_dtype = DType::f32;
  // The weights' type in ZeRO's all-gathers (parallel.gather_dtype): f32, or the 16-bit type
  // the model's products round to (bf16 under model.precision bf16, f16 under fp16). Then the
  // product operands (ParamInfo::product_operand) travel in 16 bits and everything else (norms,
  // biases, lookup tables, the router) in f32, so every rank computes exactly what it would with
  // f32 gathers, for a little over half the bytes.
  DType gather_dtype = DType::f32;
  using Replica = WeightReplica;
  WeightReplica weight_replica = WeightReplica::auto_choice;
  // On the stages the trainer chose (parallel.offload), from the start: the Adam moments in
  // `offload_moments`, and at ZeRO-3 this rank's parameter chunks in `offload_params`; a disk's
  // files under offload_dir.
  optim::OffloadTarget offload_moments = optim::OffloadTarget::none;
  optim::OffloadTarget offload_params = optim::OffloadTarget::none;
  std::string offload_dir = {};
};

// The weights' type in ZeRO's all-gathers once the layout's rules apply: stage 0 gathers
// nothing, and 1-bit Adam's ZeRO-1 step adds each weight change to every rank's copy, which must
// then be the same fp32 values everywhere.
DType effective_gather_dtype(const DataParallelOptions& opt, optim::OptimizerKind optimizer);
// Whether the replica can be kept at all: stages 1-2 with 16-bit gathers in effect.
bool weight_replica_possible(const DataParallelOptions& opt, optim::OptimizerKind optimizer);
// Throws "[config] parallel.weight_replica=on needs parallel.zero_stage 1 or 2 and 16-bit ..."
// where the replica cannot be kept.
void check_weight_replica(const DataParallelOptions& opt, optim::OptimizerKind optimizer);

// Throws "[config] parallel.gather_dtype=bf16 needs model.precision=bf16 ..." unless `gather`
// is f32 or the 16-bit type `precision`'s products round to.
void check_gather_dtype(DType gather, model::Precision precision);

}  // namespace loom::parallel
