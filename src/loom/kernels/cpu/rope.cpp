// Rotary position embedding, rotate-half layout: dimension i pairs with i + D/2 and turns by
// pos * inv_freq[i] (plain RoPE: theta^(-2i/D)). Applied in place; the inverse rotation is the
// backward.
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {

template <class T>
void rope_apply(T* x, int64_t rows, int64_t stride, int64_t col0, int64_t n_heads, int64_t D, const int32_t* pos,
                const double* inv_freq, bool inverse) {
  const int64_t half = D / 2;
  const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel
  {
    std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(pos[r]) * inv_freq[size_t(i)];
        cs[size_t(i)] = T(std::cos(a));
        sn[size_t(i)] = T(sign * std::sin(a));
      }
      T* row = x + r * stride + col0;
      for (int64_t h = 0; h < n_heads; ++h) {
        T* v = row + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const T a = v[i], b = v[i + half];
          v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
          v[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
        }
      }
    }
  }
}

template void rope_apply<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, const double*,
                                bool);
template void rope_apply<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, const double*,
                                 bool);

}  // namespace loom::cpu
