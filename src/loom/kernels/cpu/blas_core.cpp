#include "loom/kernels/cpu/blas_core.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

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
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

}  // namespace loom::cpu
