// Which optimizer a run uses (optim.name) and its names. Apart from adamw.h so that the
// configuration reader (and the fuzz target that links it alone) can parse the name without
// the optimizer's kernels.
#pragma once
#include <string>

namespace loom::optim {

// AdamW, or 1-bit Adam: AdamW for `freeze_step` steps, then the variance frozen and the
// momentum averaged over data-parallel ranks by a 1-bit compressed all-reduce (comm/onebit.h;
// optim::OneBitAdam).
enum class OptimizerKind { adamw, onebit_adam };
// "adamw", "onebit_adam" (the names optim.name takes).
const char* optimizer_name(OptimizerKind kind);
// The inverse; throws "[config] optim.name 'x' is not adamw or onebit_adam".
OptimizerKind optimizer_from_name(const std::string& name);

}  // namespace loom::optim
