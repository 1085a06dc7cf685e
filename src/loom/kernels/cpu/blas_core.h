// Which OpenBLAS kernels this process runs, and the fix for a build that does not know the
// CPU. OpenBLAS picks its kernels when the library loads, from the CPU's model number; on a
// CPU newer than the build (or a VM that hides the model) it falls back to Prescott's SSE3
// kernels: SGEMM at a fifth of the rate (2-core Sapphire-Rapids-class Xeon VM, OpenBLAS 0.3.21:
// 54 against 253 GFLOP/s with SkylakeX's kernels).
#pragma once
#include <string>

namespace loom::cpu {

std::string blas_core();  // openblas_get_corename(), e.g. "SkylakeX", "Haswell", "Prescott"
// The OPENBLAS_CORETYPE that gives this CPU vector kernels when OpenBLAS chose a generic SSE
// core ("SkylakeX" with AVX-512, "Haswell" with AVX2 and FMA); "" when its choice is fine or
// the variable is already set (then it is the user's, or our machines' workaround for a
// processor an OpenBLAS build mishandles, and is respected).
std::string blas_core_fix();

}  // namespace loom::cpu
