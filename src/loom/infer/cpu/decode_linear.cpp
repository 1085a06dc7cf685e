// decode_linear: threads take 64-row ranges of W and stream each once for all M inputs; per
// output, four 16-lane accumulators per input row, reduced in a fixed order at the end.
#include "loom/infer/cpu/decode_linear.h"

#include <algorithm>
#include <cstring>

namespace loom::infer {
namespace {

typedef float v16 __attribute__((vector_size(64)));

// Unaligned load (by pointer: returning a 64-byte vector by value trips -Wpsabi).
[[gnu::always_inline]] inline void load16(v16* v, const float* p) { std::memcpy(v, p, sizeof(*v)); }

// Four accumulators per row over interleaved 16-float chunks keep several loads in flight;
// the same structure for every MT keeps a row's bits independent of the batch.
template <int MT>
[[gnu::always_inline]] inline void rows_tile(const float* x, const float* w, const float* b,
                                             float* y, int64_t I, int64_t O, int64_t o0,
                                             int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * I;
    v16 acc[MT][4];
    for (int m = 0; m < MT; ++m)
      for (int u = 0; u < 4; ++u) acc[m][u] = v16{};
    v16 wv, xv;
    int64_t i = 0;
    for (; i + 64 <= I; i += 64)
      for (int u = 0; u < 4; ++u) {
        load16(&wv, wr + i + 16 * u);
        for (int m = 0; m < MT; ++m) {
          load16(&xv, x + m * I + i + 16 * u);
          acc[m][u] += wv * xv;
        }
      }
    for (; i + 16 <= I; i += 16) {
      load16(&wv, wr + i);
      for (int m = 0; m < MT; ++m) {
        load16(&xv, x + m * I + i);
        acc[m][0] += wv * xv;
      }
    }
    for (int m = 0; m < MT; ++m) {
      const v16 t = (acc[m][0] + acc[m][1]) + (acc[m][2] + acc[m][3]);
      float s = 0;
      for (int k = 0; k < 16; ++k) s += t[k];
      for (int64_t j = i; j < I; ++j) s += wr[j] * x[m * I + j];
      y[m * O + o] = (b ? b[o] : 0.f) + s;
    }
  }
}

// Output rows [o0, o1) for all M input rows.
[[gnu::always_inline]] inline void run_rows(const float* x, const float* w, const float* b,
                                            float* y, int64_t M, int64_t I, int64_t O,
                                            int64_t o0, int64_t o1) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) rows_tile<4>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m + 2 <= M; m += 2) rows_tile<2>(x + m * I, w, b, y + m * O, I, O, o0, o1);
  for (; m < M; ++m) rows_tile<1>(x + m * I, w, b, y + m * O, I, O, o0, o1);
}

// One function per instruction set. The OpenMP region stays outside them: GCC outlines a
// parallel region's body into a function of its own that would not inherit the target.
using Fn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                    int64_t, int64_t);

[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")]]
void rows_avx512(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I,
                 int64_t O, int64_t o0, int64_t o1) {
  run_rows(x, w, b, y, M, I, O, o0, o1);
}
[[gnu::target("avx2,fma")]]
void rows_avx2(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I,
               int64_t O, int64_t o0, int64_t o1) {
  run_rows(x, w, b, y, M, I, O, o0, o1);
}
void rows_base(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I,
               int64_t O, int64_t o0, int64_t o1) {
  run_rows(x, w, b, y, M, I, O, o0, o1);
}

Fn pick() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return rows_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return rows_avx2;
  return rows_base;
}

}  // namespace

void decode_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I,
                   int64_t O) {
  static const Fn rows = pick();
  // Output rows per work item, handed out dynamically: on a shared machine a thread that gets
  // less CPU time then does less of the work instead of holding the other at the barrier.
  constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < (O + kChunk - 1) / kChunk; ++c)
    rows(x, w, b, y, M, I, O, c * kChunk, std::min(O, c * kChunk + kChunk));
}

}  // namespace loom::infer
