// The part of the 256-bit (ymm) operations of quant_vnni_impl.h that AVX-VNNI and
// AVX512-VNNI share: types, full loads, nibble spreading, integer bit operations and the whole
// float side. Included inside each ISA's namespace, under its target pragma (all enable AVX2
// and FMA); each file's Ymm adds what differs: partial loads (copies vs byte masks),
// and_xor (two ops vs ternarylogic), the dot product (VEX or EVEX vpdpbusd, or AVX2's
// vpmaddubsw + vpmaddwd) and its tiling.
#pragma once

struct YmmCommon {
  // int8 weights reach the dot product unsigned (w + 128) unless a traits type says otherwise.
  static constexpr bool signed_i8 = false;
  using I = __m256i;
  using F = __m256;
  using H = __m128i;
  static I load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static H load_half(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
  static I spread(H h) { return _mm256_inserti128_si256(_mm256_castsi128_si256(h), _mm_srli_epi16(h, 4), 1); }
  static I bytes(int8_t v) { return _mm256_set1_epi8(v); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I xor_(I a, I b) { return _mm256_xor_si256(a, b); }
  static I lane0(int32_t v) { return _mm256_zextsi128_si256(_mm_cvtsi32_si128(v)); }
  static I izero() { return _mm256_setzero_si256(); }
  static I srli4(I v) { return _mm256_srli_epi16(v, 4); }
  static F loadf(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static I lane_blocks(int64_t per_block) {
    alignas(32) int32_t idx[8];
    for (int k = 0; k < 8; ++k) idx[k] = int32_t(k / per_block);
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
  }
  static F expand(const float* p, int n, I idx) {
    if (n == 1) return _mm256_set1_ps(*p);
    const __m128 v = n == 2 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p))) : _mm_loadu_ps(p);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), idx);
  }
  static F fzero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F fma_i(I d, F s, F acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc); }
  static float hsum(F v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
};

// What AVX2 without AVX-512 has for the parts AVX-512 does with byte masks and vpternlog.
struct YmmAvx2 : YmmCommon {
  static constexpr int64_t C = 32;
  static I load_part(const void* p, int64_t n) {
    alignas(32) uint8_t buf[32] = {};
    std::memcpy(buf, p, size_t(n));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
  }
  static H load_half_part(const void* p, int64_t n) {
    alignas(16) uint8_t buf[16] = {};
    std::memcpy(buf, p, size_t(n));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
  }
  static I and_xor(I a, I b, I c) { return _mm256_xor_si256(_mm256_and_si256(a, b), c); }
};
