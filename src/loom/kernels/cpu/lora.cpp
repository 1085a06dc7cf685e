// LoRA's products beside a frozen linear: four thin GEMMs through BLAS, the adapter's output
// added into a column range of the linear's (a slice of a fused q|k|v or gate|up output); and the
// keyed dropout on the adapters' input.
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/gemm.h"

namespace loom::cpu {

template <class T>
void lora_forward(const T* x, const T* a, const T* b, T scale, T* y, int64_t ld, int64_t col0, T* u, int64_t N,
                  int64_t I, int64_t O, int64_t r) {
  gemm(false, true, N, r, I, T(1), x, I, a, I, T(0), u, r);
  gemm(false, true, N, O, r, scale, u, r, b, r, T(1), y + col0, ld);
}

template <class T>
void lora_backward(const T* dy, int64_t ld, int64_t col0, const T* x, const T* a, const T* b, T scale, T* u, T* du,
                   T* dx, T* da, T* db, int64_t N, int64_t I, int64_t O, int64_t r) {
  const T* g = dy + col0;
  if (db) {
    gemm(false, true, N, r, I, T(1), x, I, a, I, T(0), u, r);
    gemm(true, false, O, r, N, scale, g, ld, u, r, T(1), db, r);
  }
  if (!da && !dx) return;
  gemm(false, false, N, r, O, scale, g, ld, b, r, T(0), du, r);
  if (da) gemm(true, false, r, I, N, T(1), du, r, x, I, T(1), da, I);
  if (dx) gemm(false, false, N, I, r, T(1), du, r, a, I, T(1), dx, I);
}

namespace {
// SplitMix64 of the element's counter: a uniform in [0, 1) per (key, element).
inline double uniform(uint64_t key, uint64_t i) {
  uint64_t z = key + (i + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}
}  // namespace

template <class T>
void dropout(const T* x, T* out, int64_t n, double p, uint64_t key, bool add) {
  const T keep_scale = T(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T v = uniform(key, uint64_t(i)) >= p ? x[i] * keep_scale : T(0);
    out[i] = add ? out[i] + v : v;
  }
}

#define INSTANTIATE(T)                                                                                                \
  template void lora_forward<T>(const T*, const T*, const T*, T, T*, int64_t, int64_t, T*, int64_t, int64_t, int64_t, \
                                int64_t);                                                                             \
  template void lora_backward<T>(const T*, int64_t, int64_t, const T*, const T*, const T*, T, T*, T*, T*, T*, T*,     \
                                 int64_t, int64_t, int64_t, int64_t);                                                 \
  template void dropout<T>(const T*, T*, int64_t, double, uint64_t, bool);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu
