// bf16 weights on AVX512-BF16 for few rows: x rounded to bf16 once per call, then each
// vdpbf16ps multiplies 32 weights of a row with 32 activations and adds the pairs into 16 f32
// lanes, one instruction per 64 bytes of W as the f32 kernel has per 64 bytes of f32 weights
// (widening bf16 to f32 first costs three). Rows are W's own layout: nothing is repacked.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,prefer-vector-width=512")

namespace loom::cpu::quant {
namespace {

// OT rows of W (their outputs o..o+OT-1) against MT rows of xb, 32 columns at a time; a tail
// of I % 32 columns by masked loads (zeros add nothing).
template <int MT, int OT>
[[gnu::always_inline]] inline void tile(const uint16_t* xb, const QuantView& w, const float* b, float* y, int64_t m0,
                                        int64_t o) {
  const int64_t I = w.cols, O = w.rows;
  const uint16_t* wt = reinterpret_cast<const uint16_t*>(w.q) + o * I;
  __m512 acc[MT][OT];
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = _mm512_setzero_ps();
  const int64_t tail = I % 32;
  const __mmask32 mask = _cvtu32_mask32(tail ? ~0u >> (32 - tail) : 0);
  for (int64_t i0 = 0; i0 < I; i0 += 256) {
    const int64_t i1 = std::min(I, i0 + 256);
    prefetch_next_tile(reinterpret_cast<const uint8_t*>(wt), OT * 2 * I, OT * i0 * 2, OT * i1 * 2);
    for (int64_t i = i0; i < i1; i += 32) {
      const bool part = i + 32 > I;
      __m512i wv[OT];
      for (int t = 0; t < OT; ++t)
        wv[t] = part ? _mm512_maskz_loadu_epi16(mask, wt + t * I + i) : _mm512_loadu_si512(wt + t * I + i);
      for (int m = 0; m < MT; ++m) {
        const uint16_t* xr = xb + (m0 + m) * I + i;
        const __m512i xv = part ? _mm512_maskz_loadu_epi16(mask, xr) : _mm512_loadu_si512(xr);
        for (int t = 0; t < OT; ++t) acc[m][t] = _mm512_dpbf16_ps(acc[m][t], (__m512bh)xv, (__m512bh)wv[t]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int t = 0; t < OT; ++t) y[(m0 + m) * O + o + t] = _mm512_reduce_add_ps(acc[m][t]) + (b ? b[o + t] : 0.f);
}

template <int MT>
[[gnu::always_inline]] inline void outs(const uint16_t* xb, const QuantView& w, const float* b, float* y, int64_t m0,
                                        int64_t o0, int64_t o1) {
  // One activation row (decode) reads one weight row at a time: on Zen 4 eight rows in flight per
  // thread read 17-19 GB/s and one 26-28 (docs/PERFORMANCE.md). Every tile sums a row's blocks
  // in the same order, so a row's result does not depend on how many rows the call has.
  constexpr int OT = MT == 1 ? 1 : 4;
  int64_t o = o0;
  for (; o + OT <= o1; o += OT) tile<MT, OT>(xb, w, b, y, m0, o);
  for (; o < o1; ++o) tile<MT, 1>(xb, w, b, y, m0, o);
}

}  // namespace

void bf16_acts_avx512(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {  // round to nearest even, as f32_to_bf16
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, (__m512i)v);
  }
  for (; i < n; ++i) {
    const __m128bh v = _mm_cvtneps_pbh(_mm_set_ss(x[i]));
    out[i] = uint16_t(_mm_extract_epi16((__m128i)v, 0));
  }
}

void bf16_rows_avx512(const uint16_t* xb, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                      int64_t o1) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) outs<4>(xb, w, b, y, m, o0, o1);
  for (; m + 2 <= M; m += 2) outs<2>(xb, w, b, y, m, o0, o1);
  for (; m < M; ++m) outs<1>(xb, w, b, y, m, o0, o1);
}

}  // namespace loom::cpu::quant

#pragma GCC diagnostic pop
#pragma GCC pop_options
