// Linear layer and residual add on the CPU: GEMMs through OpenBLAS (operands rounded to bf16 or
// fp16 first under ProductPrecision::bf16/f16), or bf16_gemm for bf16 where it is faster
// (bf16_gemm.h; it rounds while packing); bias loops here.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {

GemmClock& gemm_clock() {
  static GemmClock clock;
  return clock;
}

template <class T>
void linear_forward(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t I, int64_t O, ProductPrecision prec) {
  const bool engine = std::is_same_v<T, float> && on_bf16_gemm(prec);
  if constexpr (std::is_same_v<T, float>) {
    if (!engine) {
      x = rounded_operand(prec, 0, x, N * I);
      w = rounded_operand(prec, 1, w, O * I);
    }
  }
  if (b) {
#pragma omp parallel for schedule(static) if (N * O > 65536)
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + O, y + n * O);
  }
  product_gemm(engine, false, true, N, O, I, x, I, w, I, b ? T(1) : T(0), y, O);
}

template <class T>
void linear_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t N, int64_t I, int64_t O,
                     bool accumulate_dx, ProductPrecision prec) {
  const T* dy_full = dy;  // the bias gradient sums the unrounded dy
  const bool engine = std::is_same_v<T, float> && on_bf16_gemm(prec);
  if constexpr (std::is_same_v<T, float>) {
    if (!engine) {
      dy = rounded_operand(prec, 2, dy, N * O);
      if (dx) w = rounded_operand(prec, 1, w, O * I);
      if (dw) x = rounded_operand(prec, 0, x, N * I);
    }
  }
  if (dx) product_gemm(engine, false, false, N, I, O, dy, O, w, I, accumulate_dx ? T(1) : T(0), dx, I);
  if (dw) product_gemm(engine, true, false, O, I, N, dy, O, x, I, T(1), dw, I);
  if (db) {
    // Column sums, split over columns so threads never share an output.
#pragma omp parallel for schedule(static) if (N * O > 65536)
    for (int64_t o0 = 0; o0 < O; o0 += 64) {
      const int64_t o1 = std::min(O, o0 + 64);
      T acc[64] = {};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = o0; o < o1; ++o) acc[o - o0] += dy_full[n * O + o];
      for (int64_t o = o0; o < o1; ++o) db[o] += acc[o - o0];
    }
  }
}

template <class T>
void add_forward(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void add_inplace(T* acc, const T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

#define INSTANTIATE(T)                                                                                            \
  template void linear_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, ProductPrecision); \
  template void linear_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t, bool,     \
                                   ProductPrecision);                                                             \
  template void add_forward<T>(const T*, const T*, T*, int64_t);                                                  \
  template void add_inplace<T>(T*, const T*, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu
