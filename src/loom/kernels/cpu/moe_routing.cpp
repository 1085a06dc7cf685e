#include "loom/kernels/cpu/moe_routing.h"

#include <algorithm>

namespace loom::cpu {

template <class T>
void moe_gather_rows(const T* x, int64_t C, const int32_t* choice_of, int64_t k, const T* scale, int64_t n, T* out) {
#pragma omp parallel for schedule(static) if (n * C > 32768)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t c = choice_of[r];
    const T* src = x + (c / k) * C;
    T* dst = out + r * C;
    if (scale) {
      const T s = scale[c];
      for (int64_t i = 0; i < C; ++i) dst[i] = s * src[i];
    } else {
      std::copy(src, src + C, dst);
    }
  }
}

template <class T>
void moe_combine(const T* rows, int64_t C, const int32_t* row_of, const T* gates, int64_t N, int64_t k, bool accumulate,
                 T* y) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t t = 0; t < N; ++t) {
    T* dst = y + t * C;
    if (!accumulate) std::fill(dst, dst + C, T(0));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      if (r < 0) continue;
      const T g = gates ? gates[t * k + j] : T(1);
      const T* src = rows + r * C;
      for (int64_t i = 0; i < C; ++i) dst[i] += g * src[i];
    }
  }
}

template <class T>
void moe_gate_grads(const T* dy, const T* rows, int64_t C, const int32_t* row_of, int64_t N, int64_t k, T* dgate) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      T acc = 0;
      if (r >= 0) {
        const T* a = dy + t * C;
        const T* b = rows + r * C;
        for (int64_t i = 0; i < C; ++i) acc += a[i] * b[i];
      }
      dgate[t * k + j] = acc;
    }
}

#define LOOM_MOE_INSTANTIATE(T)                                                                          \
  template void moe_gather_rows<T>(const T*, int64_t, const int32_t*, int64_t, const T*, int64_t, T*);   \
  template void moe_combine<T>(const T*, int64_t, const int32_t*, const T*, int64_t, int64_t, bool, T*); \
  template void moe_gate_grads<T>(const T*, const T*, int64_t, const int32_t*, int64_t, int64_t, T*);
LOOM_MOE_INSTANTIATE(float)
LOOM_MOE_INSTANTIATE(double)
#undef LOOM_MOE_INSTANTIATE

}  // namespace loom::cpu
