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

}  // namespace loom::cpu::quant

#pragma GCC pop_options
