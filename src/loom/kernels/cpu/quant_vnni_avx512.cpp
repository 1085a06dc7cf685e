// The integer-dot kernels of quant_vnni_impl.h for AVX512-VNNI: 64-byte chunks in zmm
// registers, 32-byte chunks (blocks shorter than 64) in ymm; block tails by masked loads.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as maybe
// uninitialized once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,bmi2,prefer-vector-width=512")

namespace loom::cpu::quant::avx512 {

#include "loom/kernels/cpu/quant_vnni_ymm.h"

// f = (a & b) ^ c as a vpternlog immediate (a = 0xF0, b = 0xCC, c = 0xAA).
constexpr int kAndXor = (0xF0 & 0xCC) ^ 0xAA;

struct Zmm {
  static constexpr bool signed_i8 = false;
  static constexpr int64_t C = 64;
  // 2 x 4 (8 int32 and 8 f32 accumulators) or 1 x 8; 4 x 2 spilled and ran 30% slower.
  static constexpr int max_rows = 2;
  static constexpr int out_tile(int mt) { return mt >= 2 ? 4 : 8; }
  using I = __m512i;
  using F = __m512;
  using H = __m256i;
  static I load(const void* p) { return _mm512_loadu_si512(p); }
  static I load_part(const void* p, int64_t n) { return _mm512_maskz_loadu_epi8(_cvtu64_mask64(~0ull >> (64 - n)), p); }
  static H load_half(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static H load_half_part(const void* p, int64_t n) {
    return _mm256_maskz_loadu_epi8(_cvtu32_mask32(~0u >> (32 - n)), p);
  }
  // [h, h >> 4]: low nibbles (even columns) then high nibbles (odd columns), before masking.
  static I spread(H h) { return _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 4), 1); }
  static I bytes(int8_t v) { return _mm512_set1_epi8(v); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
  static I and_xor(I a, I b, I c) { return _mm512_ternarylogic_epi32(a, b, c, kAndXor); }
  static I dot(I acc, I u, I x) { return _mm512_dpbusd_epi32(acc, u, x); }
  static I dot2(I acc, I u1, I x1, I u2, I x2) { return dot(dot(acc, u1, x1), u2, x2); }
  static I lane0(int32_t v) { return _mm512_zextsi128_si512(_mm_cvtsi32_si128(v)); }
  static I izero() { return _mm512_setzero_si512(); }
  static I srli4(I v) { return _mm512_srli_epi16(v, 4); }
  static F loadf(const void* p) { return _mm512_loadu_ps(p); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  // Lane k -> k / per_block: the index vector that spreads a step's block values over lanes.
  static I lane_blocks(int64_t per_block) {
    alignas(64) int32_t idx[16];
    for (int k = 0; k < 16; ++k) idx[k] = int32_t(k / per_block);
    return _mm512_load_si512(idx);
  }
  static F expand(const float* p, int n, I idx) {
    if (n == 1) return _mm512_set1_ps(*p);
    const __m128 v = n == 2 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p))) : _mm_loadu_ps(p);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
  }
  static F fzero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F fma_i(I d, F s, F acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc); }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
};

struct Ymm : YmmCommon {
  static constexpr int64_t C = 32;
  static constexpr int max_rows = 4;
  static constexpr int out_tile(int mt) { return mt >= 4 ? 2 : 4; }
  static I load_part(const void* p, int64_t n) { return _mm256_maskz_loadu_epi8(_cvtu32_mask32(~0u >> (32 - n)), p); }
  static H load_half_part(const void* p, int64_t n) {
    return _mm_maskz_loadu_epi8(_cvtu32_mask16(0xFFFFu >> (16 - n)), p);
  }
  static I and_xor(I a, I b, I c) { return _mm256_ternarylogic_epi32(a, b, c, kAndXor); }
  static I dot(I acc, I u, I x) { return _mm256_dpbusd_epi32(acc, u, x); }
  static I dot2(I acc, I u1, I x1, I u2, I x2) { return dot(dot(acc, u1, x1), u2, x2); }
};

}  // namespace loom::cpu::quant::avx512

#define LOOM_QUANT_ISA avx512
#include "loom/kernels/cpu/quant_vnni_impl.h"
#undef LOOM_QUANT_ISA

namespace loom::cpu::quant {

void quantize_acts_avx512(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale,
                          int32_t* sum, int64_t m0, int64_t m1) {
  avx512::quantize_acts<avx512::Zmm>(x, w, lay, q, scale, sum, m0, m1);
}

void int_rows_avx512(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                     int64_t o1) {
  if (a.lay.chunk == avx512::Zmm::C)
    avx512::int_rows<avx512::Zmm>(a, w, b, y, M, o0, o1);
  else
    avx512::int_rows<avx512::Ymm>(a, w, b, y, M, o0, o1);
}

}  // namespace loom::cpu::quant

#pragma GCC diagnostic pop
#pragma GCC pop_options
