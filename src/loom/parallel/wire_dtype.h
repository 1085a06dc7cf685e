// f32 tensors narrowed to a 16-bit wire type (bf16 or f16, nearest even) and widened back: what
// gradients on the wire in bf16 (DataParallel's all-reduce and reduce-scatter) and pipeline
// activations and gradients in 16 bits (PipelineStage) do around their transfers.
#pragma once
#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/tensor.h"

namespace loom::parallel::detail {

// dst (bf16 or f16) = src (f32) rounded to nearest even.
inline void narrow_to_16(const Tensor& src, const Tensor& dst) {
  LOOM_CHECK(src.numel() == dst.numel() && (dst.dtype() == DType::bf16 || dst.dtype() == DType::f16), "wire",
             "narrowing ", src.describe(), " into ", dst.describe());
  const float* s = src.data<float>();
  const int64_t n = src.numel();
  if (dst.dtype() == DType::bf16) {
    bf16_t* d = dst.data<bf16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  } else {
    f16_t* d = dst.data<f16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
  }
}

// dst (f32) = or += the 16-bit values of src (bf16 or f16).
inline void widen_16(const Tensor& src, float* dst, bool add) {
  const int64_t n = src.numel();
  if (src.dtype() == DType::bf16) {
    const bf16_t* s = src.data<bf16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t i = 0; i < n; ++i) dst[i] = (add ? dst[i] : 0.f) + bf16_to_f32(s[i]);
  } else {
    LOOM_CHECK(src.dtype() == DType::f16, "wire", "widening ", src.describe(), ": not a 16-bit float");
    const f16_t* s = src.data<f16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] = (add ? dst[i] : 0.f) + f16_to_f32(s[i]);
  }
}

}  // namespace loom::parallel::detail
