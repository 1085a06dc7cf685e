// The f32 paths of quant_linear for few rows (quant_f32_impl.h) compiled for AVX-512, AVX2
// and the x86-64 baseline. Only the int8 -> f32 and bf16 -> f32 widening differ between them:
// GCC's generic vectors and its vectoriser turn them scalar or split in these loops, so they
// are written per set here.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu::quant {

// Any group: one dequantized row at a time, dotted with every x row in order (groups that are
// not whole multiples of 16 columns: tests' odd shapes).
void f32_rows_any_group(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                        int64_t o1) {
  thread_local std::vector<float> row;
  const int64_t I = w.cols, O = w.rows;
  if (int64_t(row.size()) < I) row.resize(size_t(I));
  for (int64_t o = o0; o < o1; ++o) {
    dequantize_row(w, o, row.data());
    for (int64_t m = 0; m < M; ++m) {
      float sum = 0;
      for (int64_t i = 0; i < I; ++i) sum += row[size_t(i)] * x[m * I + i];
      y[m * O + o] = sum + (b ? b[o] : 0.f);
    }
  }
}

}  // namespace loom::cpu::quant

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
typedef float v16 __attribute__((vector_size(64)));
// bf16 is the top half of an f32: zero-extend each 16-bit value and shift it up.
[[gnu::always_inline]] inline void load_bf16x16(v16* v, const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *v = (v16)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
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

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace loom::cpu::quant::avx2 {
[[gnu::always_inline]] inline void to_f32(__m128i v, float s, float* out) {
  const __m256 sv = _mm256_set1_ps(s);
  _mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), sv));
  _mm256_store_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v))), sv));
}
typedef float v16 __attribute__((vector_size(64)));
[[gnu::always_inline]] inline void load_bf16x16(v16* v, const uint8_t* p) {
  __m256 half[2];
  for (int h = 0; h < 2; ++h) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h));
    half[h] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
  }
  std::memcpy(v, half, sizeof(*v));
}
}  // namespace loom::cpu::quant::avx2
#define LOOM_QUANT_ISA avx2
#include "loom/kernels/cpu/quant_f32_impl.h"
#undef LOOM_QUANT_ISA
namespace loom::cpu::quant {
void f32_rows_avx2(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  avx2::f32_rows<2, 2>(x, w, b, y, M, o0, o1);
}
}  // namespace loom::cpu::quant
#pragma GCC pop_options

namespace loom::cpu::quant::base {
// SSE2: each byte to the top of a 32-bit lane, then an arithmetic shift sign-extends it.
[[gnu::always_inline]] inline void to_f32(__m128i v, float s, float* out) {
  const __m128 sv = _mm_set1_ps(s);
  const __m128i z = _mm_setzero_si128(), lo = _mm_unpacklo_epi8(z, v), hi = _mm_unpackhi_epi8(z, v);
  _mm_store_ps(out, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(z, lo), 24)), sv));
  _mm_store_ps(out + 4, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(z, lo), 24)), sv));
  _mm_store_ps(out + 8, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(z, hi), 24)), sv));
  _mm_store_ps(out + 12, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(z, hi), 24)), sv));
}
typedef float v16 __attribute__((vector_size(64)));
// SSE2: interleaving a zero below each 16-bit value puts its bits in the top half of a lane.
[[gnu::always_inline]] inline void load_bf16x16(v16* v, const uint8_t* p) {
  const __m128i z = _mm_setzero_si128();
  __m128i q[4];
  for (int h = 0; h < 2; ++h) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h));
    q[2 * h] = _mm_unpacklo_epi16(z, x);
    q[2 * h + 1] = _mm_unpackhi_epi16(z, x);
  }
  std::memcpy(v, q, sizeof(*v));
}
}  // namespace loom::cpu::quant::base
#define LOOM_QUANT_ISA base
#include "loom/kernels/cpu/quant_f32_impl.h"
#undef LOOM_QUANT_ISA
namespace loom::cpu::quant {
void f32_rows_base(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  base::f32_rows<2, 2>(x, w, b, y, M, o0, o1);
}
}  // namespace loom::cpu::quant
