// Whether this process multiplies bf16 products with bf16_gemm (bf16_gemm.h), and the call
// itself. Built without AVX-512 flags: the kernels are in bf16_gemm_avx512.cpp.
#include "loom/kernels/cpu/bf16_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "loom/core/cpu_features.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/gemm.h"

namespace loom::cpu {

bool bf16_gemm_runs_here() { return cpu_features().avx512_bf16; }

namespace {

struct Choice {
  bool use = false;
  double ratio = 0;
};

// Products per second of vdpbf16ps (2 per lane) over vfmadd231ps (1 per lane), one core.
double measured_rate_ratio() {
  constexpr int64_t kIters = 100000;  // 10^6 instructions: about 0.3 ms at one per cycle
  double bf16 = 1e9, fma = 1e9;
  bf16_gemm_detail::fma_loop_seconds(kIters / 10);  // wake the 512-bit units
  for (int i = 0; i < 5; ++i) {
    bf16 = std::min(bf16, bf16_gemm_detail::dpbf16_loop_seconds(kIters));
    fma = std::min(fma, bf16_gemm_detail::fma_loop_seconds(kIters));
  }
  return 2 * fma / bf16;
}

const Choice& choice() {
  static const Choice c = [] {
    Choice ch;
    if (const char* want = std::getenv("LOOM_BF16_GEMM")) {
      if (!std::strcmp(want, "off")) return ch;
      LOOM_CHECK(!std::strcmp(want, "on"), "bf16_gemm", "LOOM_BF16_GEMM='", want, "': expected on or off");
      LOOM_CHECK(bf16_gemm_runs_here(), "bf16_gemm",
                 "LOOM_BF16_GEMM=on but this CPU lacks AVX512-BF16; unset it to use SGEMM");
      ch.use = true;
      return ch;
    }
    if (!bf16_gemm_runs_here()) return ch;
    // LOOM_ISA below avx512 holds every kernel to that instruction set, this one included.
    if (hot_kernels_isa() != "avx512") return ch;
    ch.ratio = measured_rate_ratio();
    ch.use = ch.ratio >= 1.5;
    return ch;
  }();
  return c;
}

}  // namespace

bool bf16_gemm_preferred() { return choice().use; }
double bf16_fma_rate_ratio() { return choice().ratio; }
const char* bf16_product_path() { return bf16_gemm_preferred() ? "avx512-bf16 GEMM" : "bf16-rounded f32 x SGEMM"; }

void bf16_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  LOOM_CHECK(bf16_gemm_runs_here(), "bf16_gemm", "this CPU lacks AVX512-BF16; use rounded operands and SGEMM");
  if (M == 0 || N == 0) return;
  timed_gemm([&] { bf16_gemm_detail::gemm_avx512(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc); });
}

}  // namespace loom::cpu
