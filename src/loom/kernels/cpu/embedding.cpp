// Token + position embedding lookup and its scatter-add backward.
#include <algorithm>

#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {

template <class T>
void embedding_forward(const int32_t* tok, const int32_t* pos, const T* wte, const T* wpe, T* out, int64_t N,
                       int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const T* e = wte + int64_t(tok[n]) * C;
    T* o = out + n * C;
    if (wpe) {
      const T* p = wpe + int64_t(pos[n]) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      std::copy(e, e + C, o);
    }
  }
}

// Rows are processed in order within each column block, so the sum order (and thus the
// result) is independent of the thread count; threads own disjoint column blocks.
template <class T>
void embedding_backward(const int32_t* tok, const int32_t* pos, const T* dout, T* dwte, T* dwpe, int64_t N, int64_t C,
                        int64_t, int64_t) {
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (N * C > 65536)
  for (int64_t c0 = 0; c0 < C; c0 += kCols) {
    const int64_t c1 = std::min(C, c0 + kCols);
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * C;
      if (dwte) {
        T* e = dwte + int64_t(tok[n]) * C;
        for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
      }
      if (dwpe) {
        T* p = dwpe + int64_t(pos[n]) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

#define INSTANTIATE(T)                                                                                             \
  template void embedding_forward<T>(const int32_t*, const int32_t*, const T*, const T*, T*, int64_t, int64_t);    \
  template void embedding_backward<T>(const int32_t*, const int32_t*, const T*, T*, T*, int64_t, int64_t, int64_t, \
                                      int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu
