// Run-time choice of the f32 hot kernels: AVX-512 where the CPU has it, else AVX2+FMA, else
// the portable build (the only one off x86: on aarch64 it is vectorised for NEON). LOOM_ISA=base|avx2|avx512
// overrides (for comparisons and debugging).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/core/cpu_features.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/hot_table.h"

namespace loom::cpu {

std::vector<std::string> isas_here() {
  std::vector<std::string> out{"base"};
  if (cpu_features().avx2) out.push_back("avx2");
  if (cpu_features().avx512) out.push_back("avx512");
  return out;
}

void check_isa_runs_here(const std::string& isa, const char* who) {
  const std::vector<std::string> here = isas_here();
  LOOM_CHECK(std::find(here.begin(), here.end(), isa) != here.end(), who, "instruction set '", isa,
             "' does not run on this CPU");
}

static const HotKernels* pick_hot_kernels() {
  const bool has512 = cpu_features().avx512;
  const bool has2 = cpu_features().avx2;
  if (const char* want = std::getenv("LOOM_ISA")) {
    if (!std::strcmp(want, "base")) return hot_kernels_base();
    if (!std::strcmp(want, "avx2")) {
      LOOM_CHECK(has2, "isa", "LOOM_ISA=avx2 but this CPU lacks AVX2/FMA");
      return hot_kernels_avx2();
    }
    if (!std::strcmp(want, "avx512")) {
      LOOM_CHECK(has512, "isa", "LOOM_ISA=avx512 but this CPU lacks AVX-512");
      return hot_kernels_avx512();
    }
    fail("isa", "LOOM_ISA='", want, "': expected base, avx2 or avx512");
  }
  if (has512) return hot_kernels_avx512();
  if (has2) return hot_kernels_avx2();
  return hot_kernels_base();
}

const HotKernels& hot_kernels() {
  static const HotKernels* k = pick_hot_kernels();
  return *k;
}

std::string hot_kernels_isa() { return hot_kernels().isa; }

template <>
void attention_forward<float>(const float* qkv, float* out, float* lse, int64_t B, int64_t Tn, int64_t H, int64_t KVH,
                              int64_t D, const int32_t* pos) {
  hot_kernels().attention_forward(qkv, out, lse, B, Tn, H, KVH, D, pos);
}
template <>
void attention_backward<float>(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv,
                               int64_t B, int64_t Tn, int64_t H, int64_t KVH, int64_t D, const int32_t* pos) {
  hot_kernels().attention_backward(qkv, out, dout, lse, dqkv, B, Tn, H, KVH, D, pos);
}
template <>
void gelu_forward<float>(const float* x, float* y, int64_t n) {
  hot_kernels().gelu_forward(x, y, n);
}
template <>
void gelu_backward<float>(const float* x, const float* dy, float* dx, int64_t n) {
  hot_kernels().gelu_backward(x, dy, dx, n);
}
template <>
void swiglu_forward<float>(const float* in, float* out, int64_t N, int64_t F) {
  hot_kernels().swiglu_forward(in, out, N, F);
}
template <>
void swiglu_backward<float>(const float* in, const float* dout, float* din, int64_t N, int64_t F) {
  hot_kernels().swiglu_backward(in, dout, din, N, F);
}
template <>
void xent_rows<float>(float* logits, const int32_t* targets, float* loss, int64_t rows, int64_t V, double grad_scale,
                      bool want_grad) {
  hot_kernels().xent_rows(logits, targets, loss, rows, V, grad_scale, want_grad);
}

}  // namespace loom::cpu
