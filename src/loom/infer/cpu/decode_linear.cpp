// decode_linear: threads take 64-row ranges of W and stream each once for all M inputs, in
// register tiles of up to 4 input rows x 4 outputs (16 FMAs per 8 vector loads) on AVX-512's
// 32 registers, 2 x 4 or 1 x 8 on AVX2's 16.
#include "loom/infer/cpu/decode_linear.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::infer {
namespace {

// One vector register of floats: 16 lanes (zmm) or 8 (ymm).
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));

// Unaligned load (by pointer: returning a 64-byte vector by value trips -Wpsabi).
template <class V>
[[gnu::always_inline]] inline void load(V* v, const float* p) {
  std::memcpy(v, p, sizeof(*v));
}

// One register tile: MT input rows x OT outputs, one accumulator of L lanes each, over the
// L-float chunks of I in order; then each accumulator's lanes are summed in a fixed order and
// the scalar tail of I is added. Every output's arithmetic is the same whatever MT, OT, M or
// the output's position, so a row's result does not depend on the batch around it.
template <class V, int MT, int OT>
[[gnu::always_inline]] inline void tile(const float* x, const float* w, const float* b, float* y, int64_t I, int64_t O,
                                        int64_t o) {
  constexpr int L = int(sizeof(V) / sizeof(float));
  V acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = V{};
  V wv[OT], xv;
  int64_t i = 0;
  for (; i + L <= I; i += L) {
    for (int t = 0; t < OT; ++t) load(&wv[t], w + (o + t) * I + i);
    for (int m = 0; m < MT; ++m) {
      load(&xv, x + m * I + i);
      for (int t = 0; t < OT; ++t) acc[m][t] += wv[t] * xv;
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) {
      const V a = acc[m][t];
      float s = 0;
      for (int k = 0; k < L; ++k) s += a[k];
      const float* wr = w + (o + t) * I;
      for (int64_t j = i; j < I; ++j) s += wr[j] * x[m * I + j];
      y[m * O + o + t] = (b ? b[o + t] : 0.f) + s;
    }
}

// Outputs [o0, o1) for MT input rows: OT outputs at a time (enough independent accumulators to
// keep the FMA units busy when MT is small; with 16 registers, two rows take 4), then one.
template <class V, int Regs, int MT>
[[gnu::always_inline]] inline void rows_tile(const float* x, const float* w, const float* b, float* y, int64_t I,
                                             int64_t O, int64_t o0, int64_t o1) {
  constexpr int OT = MT >= 4 || (Regs <= 16 && MT >= 2) ? 4 : 8;
  int64_t o = o0;
  for (; o + OT <= o1; o += OT) tile<V, MT, OT>(x, w, b, y, I, O, o);
  for (; o < o1; ++o) tile<V, MT, 1>(x, w, b, y, I, O, o);
}

// Output rows [o0, o1) for all M input rows, in tiles of at most 4 (32 registers) or 2 rows
// (the W rows of the range stay in L2 between tiles).
template <class V, int Regs>
[[gnu::always_inline]] inline void run_rows(const float* x, const float* w, const float* b, float* y, int64_t M,
                                            int64_t I, int64_t O, int64_t o0, int64_t o1) {
  int64_t m = 0;
  if constexpr (Regs >= 32)
    for (; m + 4 <= M; m += 4) rows_tile<V, Regs, 4>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m + 2 <= M; m += 2) rows_tile<V, Regs, 2>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m < M; ++m) rows_tile<V, Regs, 1>(x + m * I, w, b, y + m * O, I, O, o0, o1);
}

// One function per instruction set. The OpenMP region stays outside them: GCC outlines a
// parallel region's body into a function of its own that would not inherit the target.
using Fn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);

#if defined(__x86_64__)
[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")]] void rows_avx512(
    const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O, int64_t o0, int64_t o1) {
  run_rows<v16, 32>(x, w, b, y, M, I, O, o0, o1);
}
[[gnu::target("avx2,fma")]] void rows_avx2(const float* x, const float* w, const float* b, float* y, int64_t M,
                                           int64_t I, int64_t O, int64_t o0, int64_t o1) {
  run_rows<v8, 16>(x, w, b, y, M, I, O, o0, o1);
}
#endif
void rows_base(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O, int64_t o0,
               int64_t o1) {
  run_rows<v8, 16>(x, w, b, y, M, I, O, o0, o1);
}

Fn build(const std::string& isa) {
#if defined(__x86_64__)
  if (isa == "avx512") return rows_avx512;
  if (isa == "avx2") return rows_avx2;
#endif
  LOOM_CHECK(isa == "base", "decode_linear", "no build for instruction set '", isa, "' here");
  return rows_base;
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

void decode_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O) {
  // The instruction set the CPU kernels were given (CPU features, or LOOM_ISA).
  static const Fn rows = build(cpu::hot_kernels_isa());
  run(rows, x, w, b, y, M, I, O);
}

std::vector<std::string> decode_linear_isas() {
  std::vector<std::string> out{"base"};
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    out.push_back("avx512");
#endif
  return out;
}

void decode_linear_on(const std::string& isa, const float* x, const float* w, const float* b, float* y, int64_t M,
                      int64_t I, int64_t O) {
  const std::vector<std::string> here = decode_linear_isas();
  LOOM_CHECK(std::find(here.begin(), here.end(), isa) != here.end(), "decode_linear", "instruction set '", isa,
             "' does not run on this CPU");
  run(build(isa), x, w, b, y, M, I, O);
}

}  // namespace loom::infer
