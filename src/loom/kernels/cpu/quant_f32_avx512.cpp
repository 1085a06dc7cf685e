// The f32 paths of quant_linear for few rows (quant_f32_impl.h) compiled for AVX-512: the
// int8 -> f32 and bf16 -> f32 widening in AVX-512 intrinsics (GCC's generic vectors and its
// vectoriser turn them scalar or split in these loops). x86-64 only.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as maybe
// uninitialized once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")
namespace loom::cpu::quant::avx512 {
[[gnu::always_inline]] inline void to_f32(__m128i v, float s, float* out) {
  _mm512_store_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)), _mm512_set1_ps(s)));
}
typedef float vf __attribute__((vector_size(64)));
// bf16 is the top half of an f32: zero-extend each 16-bit value and shift it up.
[[gnu::always_inline]] inline void load_bf16(vf* v, const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *v = (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}
}  // namespace loom::cpu::quant::avx512
#define LOOM_QUANT_ISA avx512
#include "loom/kernels/cpu/quant_f32_impl.h"
#undef LOOM_QUANT_ISA
namespace loom::cpu::quant {
void f32_rows_avx512(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  avx512::f32_rows<4, 4>(x, w, b, y, M, o0, o1);
}
}  // namespace loom::cpu::quant
#pragma GCC diagnostic pop
#pragma GCC pop_options
