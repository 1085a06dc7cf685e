// decode_linear: threads take 64-row ranges of W and stream each once for all M inputs, in
// register tiles of 4 input rows x 4 outputs (16 FMAs per 8 vector loads).
#include "loom/infer/cpu/decode_linear.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::infer {
namespace {

typedef float v16 __attribute__((vector_size(64)));

// Unaligned load (by pointer: returning a 64-byte vector by value trips -Wpsabi).
[[gnu::always_inline]] inline void load16(v16* v, const float* p) { std::memcpy(v, p, sizeof(*v)); }

// One register tile: MT input rows x OT outputs, one 16-lane accumulator each, over the
// 16-float chunks of I in order; then each accumulator's lanes are summed in a fixed order and
// the scalar tail of I is added. Every output's arithmetic is the same whatever MT, OT, M or
// the output's position, so a row's result does not depend on the batch around it.
template <int MT, int OT>
[[gnu::always_inline]] inline void tile(const float* x, const float* w, const float* b, float* y, int64_t I, int64_t O,
                                        int64_t o) {
  v16 acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = v16{};
  v16 wv[OT], xv;
  int64_t i = 0;
  for (; i + 16 <= I; i += 16) {
    for (int t = 0; t < OT; ++t) load16(&wv[t], w + (o + t) * I + i);
    for (int m = 0; m < MT; ++m) {
      load16(&xv, x + m * I + i);
      for (int t = 0; t < OT; ++t) acc[m][t] += wv[t] * xv;
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) {
      const v16 a = acc[m][t];
      float s = 0;
      for (int k = 0; k < 16; ++k) s += a[k];
      const float* wr = w + (o + t) * I;
      for (int64_t j = i; j < I; ++j) s += wr[j] * x[m * I + j];
      y[m * O + o + t] = (b ? b[o + t] : 0.f) + s;
    }
}

// Outputs [o0, o1) for MT input rows: 16 / MT outputs at a time (enough independent
// accumulators to keep the FMA units busy when MT is small), then one.
template <int MT>
[[gnu::always_inline]] inline void rows_tile(const float* x, const float* w, const float* b, float* y, int64_t I,
                                             int64_t O, int64_t o0, int64_t o1) {
  constexpr int OT = MT >= 4 ? 4 : 8;
  int64_t o = o0;
  for (; o + OT <= o1; o += OT) tile<MT, OT>(x, w, b, y, I, O, o);
  for (; o < o1; ++o) tile<MT, 1>(x, w, b, y, I, O, o);
}

// Output rows [o0, o1) for all M input rows, in tiles of at most MaxMT rows (the W rows of the
// range stay in L2 between tiles). MaxMT x 4 accumulators must fit the vector registers.
template <int MaxMT>
[[gnu::always_inline]] inline void run_rows(const float* x, const float* w, const float* b, float* y, int64_t M,
                                            int64_t I, int64_t O, int64_t o0, int64_t o1) {
  int64_t m = 0;
  if constexpr (MaxMT >= 4)
    for (; m + 4 <= M; m += 4) rows_tile<4>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m + 2 <= M; m += 2) rows_tile<2>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m < M; ++m) rows_tile<1>(x + m * I, w, b, y + m * O, I, O, o0, o1);
}

// One function per instruction set. The OpenMP region stays outside them: GCC outlines a
// parallel region's body into a function of its own that would not inherit the target.
using Fn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);

[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")]] void rows_avx512(
    const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O, int64_t o0, int64_t o1) {
  run_rows<4>(x, w, b, y, M, I, O, o0, o1);
}
[[gnu::target("avx2,fma")]] void rows_avx2(const float* x, const float* w, const float* b, float* y, int64_t M,
                                           int64_t I, int64_t O, int64_t o0, int64_t o1) {
  run_rows<2>(x, w, b, y, M, I, O, o0, o1);
}
void rows_base(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O, int64_t o0,
               int64_t o1) {
  run_rows<2>(x, w, b, y, M, I, O, o0, o1);
}

// The instruction set the CPU kernels were given (CPU features, or LOOM_ISA).
Fn pick() {
  const std::string isa = cpu::hot_kernels_isa();
  if (isa == "avx512") return rows_avx512;
  if (isa == "avx2") return rows_avx2;
  return rows_base;
}

}  // namespace

void decode_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O) {
  static const Fn rows = pick();
  // Output rows per work item, handed out dynamically: on a shared machine a thread that gets
  // less CPU time then does less of the work instead of holding the other at the barrier.
  constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kChunk - 1) / kChunk; ++c)
    rows(x, w, b, y, M, I, O, c * kChunk, std::min(O, c * kChunk + kChunk));
}

}  // namespace loom::infer
