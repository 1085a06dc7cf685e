// Function table of the f32 hot kernels for one instruction set (see hot_impl.h).
#pragma once
#include <cstdint>

namespace loom::cpu {

struct HotKernels {
  const char* isa;
  void (*attention_forward)(const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*);
  void (*attention_backward)(const float*, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, const int32_t*);
  void (*gelu_forward)(const float*, float*, int64_t);
  void (*gelu_backward)(const float*, const float*, float*, int64_t);
  void (*swiglu_forward)(const float*, float*, int64_t, int64_t);
  void (*swiglu_backward)(const float*, const float*, float*, int64_t, int64_t);
  void (*xent_rows)(float*, const int32_t*, float*, int64_t, int64_t, double, bool);
};

const HotKernels& hot_kernels();
const HotKernels* hot_kernels_base();
const HotKernels* hot_kernels_avx2();
const HotKernels* hot_kernels_avx512();

}  // namespace loom::cpu

#define LOOM_HOT_TABLE(ns)                                    \
  const HotKernels* hot_kernels_##ns() {                      \
    static const HotKernels k{#ns,                            \
                              &ns::attention_forward<float>,  \
                              &ns::attention_backward<float>, \
                              &ns::gelu_forward<float>,       \
                              &ns::gelu_backward<float>,      \
                              &ns::swiglu_forward<float>,     \
                              &ns::swiglu_backward<float>,    \
                              &ns::xent_rows<float>};         \
    return &k;                                                \
  }
