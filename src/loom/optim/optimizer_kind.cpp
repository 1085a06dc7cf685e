#include "loom/optim/optimizer_kind.h"

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom::optim {

namespace {
constexpr EnumName<OptimizerKind> kOptimizerNames[] = {
    {OptimizerKind::adamw, "adamw"},
    {OptimizerKind::onebit_adam, "onebit_adam"},
};
}  // namespace

const char* optimizer_name(OptimizerKind kind) { return enum_name(kOptimizerNames, kind); }

OptimizerKind optimizer_from_name(const std::string& name) {
  const auto kind = enum_from_name(kOptimizerNames, name);
  LOOM_CHECK(kind.has_value(), "config", "optim.name '", name, "' is not adamw or onebit_adam");
  return *kind;
}

}  // namespace loom::optim
