// The integer-dot kernels of quant_vnni_impl.h for AVX2 CPUs without VNNI (Haswell to Zen 3,
// and Intel client cores before Alder Lake): 32-byte chunks in ymm, with vpdpbusd's work done
// by vpmaddubsw (u8 x s8 pairs summed to s16) and vpmaddwd against ones (s16 pairs to s32).
// vpmaddubsw saturates: int4 weights (u <= 15) are safe, 2 * 15 * 127 per pair; int8 weights
// go in signed, their absolute values times the activations with the weights' signs, at most
// 2 * 128 * 127 = 32512 per pair.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi2")

namespace loom::cpu::quant::avx2i {

#include "loom/kernels/cpu/quant_vnni_ymm.h"

struct Ymm : YmmAvx2 {
  static constexpr bool signed_i8 = true;
  // 16 registers: the emulated dot product needs two temporaries beside 2 x 4 int and float
  // accumulators, the activations and the weights, so the tile is 1 x 4 or 2 x 2.
  static constexpr int max_rows = 2;
  static constexpr int out_tile(int mt) { return mt >= 2 ? 2 : 4; }
  static I ones16() { return _mm256_set1_epi16(1); }
  // u unsigned bytes of at most 15 (int4 weights), x signed.
  static I dot(I acc, I u, I x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones16()));
  }
  // Two int4 products share one widening: each 16-bit sum is at most 4 * 15 * 127.
  static I dot2(I acc, I u1, I x1, I u2, I x2) {
    const I s = _mm256_add_epi16(_mm256_maddubs_epi16(u1, x1), _mm256_maddubs_epi16(u2, x2));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, ones16()));
  }
  // w signed int8 weights: |w| times x with w's sign (zero where w is).
  static I dot_s8(I acc, I w, I x) {
    const I p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones16()));
  }
};

// The many-rows kernel's products (quant_gemm_ymm.h).
struct GemmDot {
  using I = __m256i;
  using Acc = __m256i;
  // int4 (u <= 15) sums stay 16-bit through a sub-block: at most 8 x 2 x 15 x 127 = 30480.
  static Acc u4(Acc a, I u, I x) { return _mm256_add_epi16(a, _mm256_maddubs_epi16(u, x)); }
  static Acc s8(Acc a, I abs_w, I signed_x) {
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, signed_x), _mm256_set1_epi16(1)));
  }
  static I finish(Acc a, bool int4) { return int4 ? _mm256_madd_epi16(a, _mm256_set1_epi16(1)) : a; }
};

#include "loom/kernels/cpu/quant_gemm_ymm.h"

}  // namespace loom::cpu::quant::avx2i

#define LOOM_QUANT_ISA avx2i
#include "loom/kernels/cpu/quant_vnni_impl.h"
#undef LOOM_QUANT_ISA

namespace loom::cpu::quant {

void quantize_acts_avx2i(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale,
                         int32_t* sum, int64_t m0, int64_t m1) {
  avx2i::quantize_acts<avx2i::Ymm>(x, w, lay, q, scale, sum, m0, m1);
}

void int_rows_avx2i(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                    int64_t o1) {
  avx2i::int_rows<avx2i::Ymm>(a, w, b, y, M, o0, o1);
}

void ymm_gemm_quantize_acts(const float* x, const QuantView& w, const ActLayout& L, int8_t* xq, float* sx, float* sxsum,
                            int64_t m0, int64_t m1) {
  constexpr int64_t kSub = avx2i::ymm_gemm::kSub;
  const int64_t I = w.cols, subs = I / kSub, per_block = L.block / kSub;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes packs' lane interleave
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t blk = 0; blk < I / L.block; ++blk) {
      const float* src = x + m * I + blk * L.block;
      __m256 vmax = _mm256_setzero_ps();
      for (int64_t i = 0; i < L.block; i += 8)
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, vmax);
      float amax = 0;
      for (float v : lanes) amax = std::max(amax, v);
      const float scale = amax / 127.f;
      const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.f / amax : 0.f);
      for (int64_t sub = 0; sub < per_block; ++sub) {
        const float* s = src + sub * kSub;
        __m256i r[4];  // round to nearest even (MXCSR default), as the few-rows kernels do
        for (int k = 0; k < 4; ++k) r[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + 8 * k), inv));
        const __m256i total = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        const __m256i bytes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3])), order);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + m * I + blk * L.block + sub * kSub), bytes);
        alignas(32) int32_t t[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(t), total);
        const int32_t sum = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
        const int64_t at = m * subs + blk * per_block + sub;
        sx[at] = scale;
        sxsum[at] = scale * float(sum);
      }
    }
}

int64_t ymm_gemm_items(const QuantView& w) {
  constexpr int64_t per_item = avx2i::ymm_gemm::kPanelsPerItem * avx2i::ymm_gemm::kLanes;
  return (w.rows + per_item - 1) / per_item;
}

void ymm_gemm_item_avx2i(const int8_t* xq, const float* sx, const float* sxsum, const QuantView& w, const float* b,
                         float* y, int64_t M, int64_t item) {
  avx2i::ymm_gemm::item<avx2i::GemmDot>(xq, sx, sxsum, w, b, y, M, item);
}

}  // namespace loom::cpu::quant

#pragma GCC pop_options
