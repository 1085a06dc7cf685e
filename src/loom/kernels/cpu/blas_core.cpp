#include "loom/kernels/cpu/blas_core.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

#include "loom/core/cpu_features.h"

namespace loom::cpu {

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

std::string blas_core_fix() {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set && *set) return "";
  const std::string core = blas_core();
  const bool generic = core == "Prescott" || core == "Core2" || core == "Penryn" || core == "Dunnington" ||
                       core == "Nehalem" || core == "Atom" || core == "Katmai" || core == "Coppermine" ||
                       core == "Northwood" || core == "Banias";
  if (!generic) return "";
  if (cpu_features().avx512) return "SkylakeX";
  if (cpu_features().avx2) return "Haswell";
  return "";
}

}  // namespace loom::cpu
