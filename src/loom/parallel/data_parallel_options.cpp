// The configuration rules of data_parallel_options.h.
#include "loom/parallel/data_parallel_options.h"

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom::parallel {

namespace {
constexpr EnumName<DType> kWireDtypeNames[] = {{DType::f32, "fp32"}, {DType::bf16, "bf16"}, {DType::f16, "fp16"}};
}  // namespace

const char* wire_dtype_name(DType t) { return enum_name(kWireDtypeNames, t, dtype_name(t)); }

std::optional<DType> wire_dtype_from_name(std::string_view name) { return enum_from_name(kWireDtypeNames, name); }

DType effective_gather_dtype(const DataParallelOptions& opt, optim::OptimizerKind optimizer) {
  return opt.zero_stage == 0 || optimizer == optim::OptimizerKind::onebit_adam ? DType::f32 : opt.gather_dtype;
}

bool weight_replica_possible(const DataParallelOptions& opt, optim::OptimizerKind optimizer) {
  return (opt.zero_stage == 1 || opt.zero_stage == 2) && effective_gather_dtype(opt, optimizer) != DType::f32;
}

void check_weight_replica(const DataParallelOptions& opt, optim::OptimizerKind optimizer) {
  LOOM_CHECK(opt.weight_replica != WeightReplica::on || weight_replica_possible(opt, optimizer), "config",
             "parallel.weight_replica=on needs parallel.zero_stage 1 or 2 and 16-bit weight all-gathers "
             "(parallel.gather_dtype bf16 or fp16; 1-bit Adam gathers fp32), but zero_stage=",
             opt.zero_stage, " and the gathers are ", wire_dtype_name(effective_gather_dtype(opt, optimizer)),
             "; use parallel.weight_replica=auto");
}

const char* weight_replica_name(WeightReplica r) {
  return r == WeightReplica::on ? "on" : r == WeightReplica::off ? "off" : "auto";
}

WeightReplica weight_replica_from_name(const std::string& name) {
  if (name == "auto") return WeightReplica::auto_choice;
  if (name == "on") return WeightReplica::on;
  LOOM_CHECK(name == "off", "config", "parallel.weight_replica must be auto, on or off, got '", name, "'");
  return WeightReplica::off;
}

void check_gather_dtype(DType gather, model::Precision precision) {
  if (gather == DType::f32) return;
  const DType products = precision == model::Precision::bf16   ? DType::bf16
                         : precision == model::Precision::fp16 ? DType::f16
                                                               : DType::f32;
  LOOM_CHECK(gather == DType::bf16 || gather == DType::f16, "config",
             "parallel.gather_dtype must be fp32, bf16 or fp16, got ", dtype_name(gather));
  LOOM_CHECK(gather == products, "config", "parallel.gather_dtype=", wire_dtype_name(gather),
             " needs model.precision=", wire_dtype_name(gather), " (it is ", model::precision_name(precision),
             "): 16-bit weights are exact only where every product rounds its weights to that type; use "
             "parallel.gather_dtype=fp32");
}

}  // namespace loom::parallel
