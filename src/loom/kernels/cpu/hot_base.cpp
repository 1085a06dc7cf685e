// hot_impl.h compiled for the base instruction set (flags set in src/CMakeLists.txt).
#define LOOM_ISA base
#include "loom/kernels/cpu/hot_impl.h"
#include "loom/kernels/cpu/hot_table.h"

namespace loom::cpu {
LOOM_HOT_TABLE(base)
}  // namespace loom::cpu

#include "loom/kernels/cpu/cpu_kernels.h"

// f64 instantiations (gradient checks) use the portable build only.
namespace loom::cpu {
template <>
void attention_forward<double>(const double* qkv, double* out, double* lse, int64_t B, int64_t Tn, int64_t H,
                               int64_t KVH, int64_t D, const int32_t* pos) {
  base::attention_forward<double>(qkv, out, lse, B, Tn, H, KVH, D, pos);
}
template <>
void attention_backward<double>(const double* qkv, const double* out, const double* dout, const double* lse,
                                double* dqkv, int64_t B, int64_t Tn, int64_t H, int64_t KVH, int64_t D,
                                const int32_t* pos) {
  base::attention_backward<double>(qkv, out, dout, lse, dqkv, B, Tn, H, KVH, D, pos);
}
template <>
void gelu_forward<double>(const double* x, double* y, int64_t n) {
  base::gelu_forward(x, y, n);
}
template <>
void gelu_backward<double>(const double* x, const double* dy, double* dx, int64_t n) {
  base::gelu_backward(x, dy, dx, n);
}
template <>
void swiglu_forward<double>(const double* in, double* out, int64_t N, int64_t F) {
  base::swiglu_forward(in, out, N, F);
}
template <>
void swiglu_backward<double>(const double* in, const double* dout, double* din, int64_t N, int64_t F) {
  base::swiglu_backward(in, dout, din, N, F);
}
template <>
void xent_rows<double>(double* logits, const int32_t* targets, double* loss, int64_t rows, int64_t V, double grad_scale,
                       bool want_grad) {
  base::xent_rows(logits, targets, loss, rows, V, grad_scale, want_grad);
}
}  // namespace loom::cpu
