// Internals shared by DataParallel's files (data_parallel*.cpp), not part of its interface:
// gradients on the wire in bf16, which the stage 0/1 all-reduce and the stage 2/3 reduce-scatter
// both do.
#pragma once
#include "loom/core/dtype.h"
#include "loom/core/tensor.h"

namespace loom::parallel::detail {

// dst (bf16) = src (f32) rounded to nearest even.
inline void narrow_to_bf16(const Tensor& src, const Tensor& dst) {
  const float* s = src.data<float>();
  bf16_t* d = dst.data<bf16_t>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}

// dst (f32) = or += the bf16 values of src.
inline void widen_bf16(const Tensor& src, float* dst, bool add) {
  const bf16_t* s = src.data<bf16_t>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) dst[i] = (add ? dst[i] : 0.f) + bf16_to_f32(s[i]);
}

}  // namespace loom::parallel::detail
