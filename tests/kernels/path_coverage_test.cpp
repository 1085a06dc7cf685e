// Which kernel builds this CPU's run of the suite leaves untested, said once as a skip: the
// ISA tests (isa_agreement_test, quant_linear_test) instantiate only the builds the CPU runs,
// so without this an AVX2 machine would pass them silently with its AVX-512 paths unrun, and an
// AVX-512 machine without AVX-VNNI its AVX-VNNI path; on aarch64, an ARM CPU without the
// dot-product extension its neon-dot path. docs/TESTING.md has the CPU classes.
#include <gtest/gtest.h>

#include <string>

#include "loom/core/cpu_features.h"
#include "loom/kernels/cpu/quant_linear_impl.h"

namespace {

using loom::cpu::quant::Path;

TEST(KernelPaths, NamesTheBuildsThisCpuDoesNotRun) {
#if defined(__aarch64__)
  // The x86 builds are not compiled here; aarch64's own is the quant linear path neon-dot.
  if (!loom::cpu::quant::path_runs_here(Path::neon_dot))
    GTEST_SKIP() << "not tested on this CPU: quant linear neon-dot (needs the dot-product extension, sdot)";
#elif !defined(__x86_64__)
  GTEST_SKIP() << "built for a CPU other than x86-64 and aarch64: its kernel builds (hot kernels avx2/avx512, quant "
                  "linear paths other than base-f32) are not compiled, and the portable ones are tested";
#else
  std::string untested;
  auto add = [&](const std::string& what) { untested += (untested.empty() ? "" : ", ") + what; };
  if (!loom::cpu_features().avx2) add("hot kernels avx2 (needs AVX2+FMA)");
  if (!loom::cpu_features().avx512) add("hot kernels avx512 (needs AVX-512 F/BW/VL/DQ)");
  for (int p = 0; p <= int(Path::avx512_bf16); ++p)  // the x86 paths (neon_dot is aarch64's)
    if (!loom::cpu::quant::path_runs_here(Path(p)))
      add(std::string("quant linear ") + loom::cpu::quant::path_name(Path(p)));
  if (!untested.empty()) GTEST_SKIP() << "not tested on this CPU: " << untested;
#endif
}

}  // namespace
