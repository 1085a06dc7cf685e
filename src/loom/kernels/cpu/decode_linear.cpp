// decode_linear: threads take 64-row ranges of W and stream each once for all M inputs, in
// register tiles of up to 4 input rows x 4 outputs (16 FMAs per 8 vector loads) on AVX-512's
// 32 registers, 2 x 4 or 1 x 8 on AVX2's 16.
#include "loom/kernels/cpu/decode_linear.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {
namespace {

// One function per instruction set. The OpenMP region stays outside them: GCC outlines a
// parallel region's body into a function of its own that would not inherit the target.
using Fn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);

// Each build's Fn: the tiles' run_rows on vector type V with REGS vector registers.
#define LOOM_DECODE_ROWS(V, REGS)                                                                                  \
  void rows(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O, int64_t o0, \
            int64_t o1) {                                                                                          \
    run_rows<V, REGS>(x, w, b, y, M, I, O, o0, o1);                                                                \
  }

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")
namespace avx512 {
#include "loom/kernels/cpu/decode_linear_tiles.h"
LOOM_DECODE_ROWS(v16, 32)
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "loom/kernels/cpu/decode_linear_tiles.h"
LOOM_DECODE_ROWS(v8, 16)
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace base {
#include "loom/kernels/cpu/decode_linear_tiles.h"
LOOM_DECODE_ROWS(v8, 16)
}  // namespace base
#undef LOOM_DECODE_ROWS

Fn build(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "avx512") return avx512::rows;
  if (isa == "avx2") return avx2::rows;
#endif
  LOOM_CHECK(isa == "base", "decode_linear", "no build for instruction set '", isa, "' here");
  return base::rows;
}

void run(Fn rows, const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O) {
  // Output rows per work item, handed out dynamically: on a shared machine a thread that gets
  // less CPU time then does less of the work instead of holding the other at the barrier.
  constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kChunk - 1) / kChunk; ++c)
    rows(x, w, b, y, M, I, O, c * kChunk, std::min(O, c * kChunk + kChunk));
}

}  // namespace

std::string decode_linear_isa() { return hot_kernels_isa(); }

void decode_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O) {
  static const Fn rows = build(decode_linear_isa());
  run(rows, x, w, b, y, M, I, O);
}

void decode_linear_on(const std::string& isa, const float* x, const float* w, const float* b, float* y, int64_t M,
                      int64_t I, int64_t O) {
  cpu::check_isa_runs_here(isa, "decode_linear");
  run(build(isa), x, w, b, y, M, I, O);
}

}  // namespace loom::cpu
