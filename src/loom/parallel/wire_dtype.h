// f32 tensors narrowed to a 16-bit wire type (bf16 or f16, nearest even) and widened back: what
// gradients on the wire in bf16 (DataParallel's all-reduce and reduce-scatter) and pipeline
// activations and gradients in 16 bits (PipelineStage) do around their transfers.
#pragma once
#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/tensor.h"
#include "loom/kernels/cpu/rounded_operands.h"

namespace loom::parallel::detail {

// dst (bf16 or f16) = src (f32) rounded to nearest even.
inline void narrow_to_16(const Tensor& src, const Tensor& dst) {
  LOOM_CHECK(src.numel() == dst.numel() && (dst.dtype() == DType::bf16 || dst.dtype() == DType::f16), "wire",
             "narrowing ", src.describe(), " into ", dst.describe());
  cpu::narrow_to_16(dst.dtype() == DType::bf16, src.data<float>(), static_cast<uint16_t*>(dst.raw()), src.numel());
}

// dst (f32) = or += the 16-bit values of src (bf16 or f16).
inline void widen_16(const Tensor& src, float* dst, bool add) {
  LOOM_CHECK(src.dtype() == DType::bf16 || src.dtype() == DType::f16, "wire", "widening ", src.describe(),
             ": not a 16-bit float");
  const int64_t n = src.numel();
  const bool bf16 = src.dtype() == DType::bf16;
  if (!add) return cpu::widen_from_16(bf16, static_cast<const uint16_t*>(src.raw()), dst, n);
  const uint16_t* s = static_cast<const uint16_t*>(src.raw());
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] += bf16 ? bf16_to_f32(bf16_t{s[i]}) : f16_to_f32(f16_t{s[i]});
}

}  // namespace loom::parallel::detail
