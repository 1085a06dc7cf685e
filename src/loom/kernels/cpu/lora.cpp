// LoRA's products beside a frozen linear: four thin GEMMs through BLAS, the adapter's output
// added into a column range of the linear's (a slice of a fused q|k|v or gate|up output).
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

#define INSTANTIATE(T)                                                                                                \
  template void lora_forward<T>(const T*, const T*, const T*, T, T*, int64_t, int64_t, T*, int64_t, int64_t, int64_t, \
                                int64_t);                                                                             \
  template void lora_backward<T>(const T*, int64_t, int64_t, const T*, const T*, const T*, T, T*, T*, T*, T*, T*,     \
                                 int64_t, int64_t, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace loom::cpu
