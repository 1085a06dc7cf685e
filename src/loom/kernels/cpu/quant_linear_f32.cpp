// The f32 paths of quant_linear for few rows (quant_f32_impl.h) compiled for the target's
// baseline (SSE2 on x86-64, where quant_f32_avx2/avx512.cpp add the wider sets; NEON through
// GCC's vectoriser elsewhere), and the kernel for groups of any size. On x86 the int8 -> f32
// and bf16 -> f32 widening is written in SSE2: GCC's generic vectors and its vectoriser turn
// it scalar or split in these loops.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

namespace loom::cpu::quant::base {
#if defined(__x86_64__)
// SSE2: each byte to the top of a 32-bit lane, then an arithmetic shift sign-extends it.
[[gnu::always_inline]] inline void to_f32(__m128i v, float s, float* out) {
  const __m128 sv = _mm_set1_ps(s);
  const __m128i z = _mm_setzero_si128(), lo = _mm_unpacklo_epi8(z, v), hi = _mm_unpackhi_epi8(z, v);
  _mm_store_ps(out, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(z, lo), 24)), sv));
  _mm_store_ps(out + 4, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(z, lo), 24)), sv));
  _mm_store_ps(out + 8, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(z, hi), 24)), sv));
  _mm_store_ps(out + 12, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(z, hi), 24)), sv));
}
typedef float vf __attribute__((vector_size(16)));
// SSE2: interleaving a zero below each 16-bit value puts its bits in the top half of a lane.
[[gnu::always_inline]] inline void load_bf16(vf* v, const uint8_t* p) {
  const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  *v = (vf)_mm_unpacklo_epi16(_mm_setzero_si128(), x);
}
#else
typedef float vf __attribute__((vector_size(16)));
[[gnu::always_inline]] inline void load_bf16(vf* v, const uint8_t* p) {
  uint16_t h[4];
  uint32_t u[4];
  std::memcpy(h, p, sizeof h);
  for (int k = 0; k < 4; ++k) u[k] = uint32_t(h[k]) << 16;
  std::memcpy(v, u, sizeof u);
}
#endif
}  // namespace loom::cpu::quant::base
#define LOOM_QUANT_ISA base
#include "loom/kernels/cpu/quant_f32_impl.h"
#undef LOOM_QUANT_ISA
namespace loom::cpu::quant {
void f32_rows_base(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0, int64_t o1) {
  base::f32_rows<2, 2>(x, w, b, y, M, o0, o1);
}
}  // namespace loom::cpu::quant
