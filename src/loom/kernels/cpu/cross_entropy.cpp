// LM head fused with softmax cross-entropy, a chunk of rows at a time, so the [N, V] logits
// never exist at once: per chunk, GEMM to logits, softmax rows in place into dlogits, then
// the two backward GEMMs. Workspace is chunk * V elements. Under ProductPrecision::bf16/f16 x and
// W are rounded once per call, dlogits per chunk (in the workspace), unless bf16 products run
// on bf16_gemm, whose packing rounds.
#include <algorithm>
#include <type_traits>

#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::cpu {

template <class T>
void lm_head_xent(const T* x, const T* w, const int32_t* targets, T* loss, T* dx, T* dw, int64_t N, int64_t C,
                  int64_t V, double grad_scale, int64_t chunk, T* workspace, ProductPrecision prec) {
  const bool want_grad = dx || dw;
  const bool engine = std::is_same_v<T, float> && on_bf16_gemm(prec);
  if constexpr (std::is_same_v<T, float>) {
    if (!engine) {
      x = rounded_operand(prec, 0, x, N * C);
      w = rounded_operand(prec, 1, w, V * C);
    }
  }
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t nr = std::min(chunk, N - r0);
    product_gemm(engine, false, true, nr, V, C, x + r0 * C, C, w, C, T(0), workspace, V);
    xent_rows<T>(workspace, targets + r0, loss + r0, nr, V, grad_scale, want_grad);
    if constexpr (std::is_same_v<T, float>)
      if (want_grad && !engine) round_operand(prec, workspace, workspace, nr * V);
    if (dx) product_gemm(engine, false, false, nr, C, V, workspace, V, w, C, T(0), dx + r0 * C, C);
    if (dw) product_gemm(engine, true, false, V, C, nr, workspace, V, x + r0 * C, C, T(1), dw, C);
  }
}

template void lm_head_xent<float>(const float*, const float*, const int32_t*, float*, float*, float*, int64_t, int64_t,
                                  int64_t, double, int64_t, float*, ProductPrecision);
template void lm_head_xent<double>(const double*, const double*, const int32_t*, double*, double*, double*, int64_t,
                                   int64_t, int64_t, double, int64_t, double*, ProductPrecision);

}  // namespace loom::cpu
