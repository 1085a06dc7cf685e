// The f32 paths of quant_linear for few rows (quant_f32_impl.h) compiled for AVX2: the int8 ->
// f32 and bf16 -> f32 widening in AVX2 intrinsics. x86-64 only.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace loom::cpu::quant::avx2 {
[[gnu::always_inline]] inline void to_f32(__m128i v, float s, float* out) {
  const __m256 sv = _mm256_set1_ps(s);
  _mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), sv));
  _mm256_store_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v))), sv));
}
typedef float vf __attribute__((vector_size(32)));
// bf16 is the top half of an f32: zero-extend each 16-bit value and shift it up.
[[gnu::always_inline]] inline void load_bf16(vf* v, const uint8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  *v = (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16);
}
}  // namespace loom::cpu::quant::avx2
#define LOOM_QUANT_ISA avx2
#include "loom/kernels/cpu/quant_f32_impl.h"
#undef LOOM_QUANT_ISA
namespace loom::cpu::quant {
void f32_rows_avx2(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  avx2::f32_rows<2, 4>(x, w, b, y, M, o0, o1);
}
}  // namespace loom::cpu::quant
#pragma GCC pop_options
