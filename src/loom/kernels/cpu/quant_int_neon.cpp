// The integer-dot kernels of quant_vnni_impl.h for aarch64 CPUs with the dot-product extension
// (FEAT_DotProd, HWCAP_ASIMDDP: Cortex-A55/A76 and later, Neoverse, Apple M): 16-byte chunks in
// one 128-bit register, sdot (vdotq_s32) for the products. sdot multiplies signed by signed
// bytes, so int8 weights go in as they are (no -128 * sum correction, as on avx2-int) and int4
// nibbles (<= 15) are signed bytes too. Few rows and many alike: the kernel's result for a row
// does not depend on M. Compiled only for aarch64 (LOOM_ARM64_ONLY_SOURCES in CMakeLists.txt).
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
// Not "+dotprod": arm_neon.h declares vdotq_s32 for armv8.2-a+dotprod, and a function built for
// the armv8-a baseline plus dotprod does not inline it.
#pragma GCC target("arch=armv8.2-a+dotprod")

namespace loom::cpu::quant::neon {

struct Neon {
  static constexpr int64_t C = 16;
  static constexpr bool signed_i8 = true;
  // 32 registers: 4 x 2 or 2 x 4 int and float accumulators beside the activations and weights.
  static constexpr int max_rows = 4;
  static constexpr int out_tile(int mt) { return mt >= 4 ? 2 : 4; }
  // Integer vectors are bytes; the accumulators are int32 lanes in the same registers.
  using I = int8x16_t;
  using F = float32x4_t;
  using H = uint8x8_t;
  static int32x4_t s32(I v) { return vreinterpretq_s32_s8(v); }
  static I s8(int32x4_t v) { return vreinterpretq_s8_s32(v); }

  static I load(const void* p) { return vld1q_s8(static_cast<const int8_t*>(p)); }
  static H load_half(const void* p) { return vld1_u8(static_cast<const uint8_t*>(p)); }
  static I load_part(const void* p, int64_t n) {
    int8_t buf[16] = {};
    std::memcpy(buf, p, size_t(n));
    return vld1q_s8(buf);
  }
  static H load_half_part(const void* p, int64_t n) {
    uint8_t buf[8] = {};
    std::memcpy(buf, p, size_t(n));
    return vld1_u8(buf);
  }
  // Low nibbles in the low half, high nibbles in the high half (the kernels mask with 0x0F).
  static I spread(H h) { return vreinterpretq_s8_u8(vcombine_u8(h, vshr_n_u8(h, 4))); }
  static I bytes(int8_t v) { return vdupq_n_s8(v); }
  static I and_(I a, I b) { return vandq_s8(a, b); }
  static I xor_(I a, I b) { return veorq_s8(a, b); }
  static I and_xor(I a, I b, I c) { return veorq_s8(vandq_s8(a, b), c); }
  static I lane0(int32_t v) { return s8(vsetq_lane_s32(v, vdupq_n_s32(0), 0)); }
  static I izero() { return vdupq_n_s8(0); }
  static I srli4(I v) { return vreinterpretq_s8_u8(vshrq_n_u8(vreinterpretq_u8_s8(v), 4)); }

  static I dot(I acc, I u, I x) { return s8(vdotq_s32(s32(acc), u, x)); }
  static I dot2(I acc, I u1, I x1, I u2, I x2) { return dot(dot(acc, u1, x1), u2, x2); }
  static I dot_s8(I acc, I w, I x) { return dot(acc, w, x); }

  // Scales and corrections sit at byte offsets in the activation rows: loaded as bytes.
  static F loadf(const void* p) { return vreinterpretq_f32_u8(vld1q_u8(static_cast<const uint8_t*>(p))); }
  static F cvt(I v) { return vcvtq_f32_s32(s32(v)); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F fzero() { return vdupq_n_f32(0.f); }
  static F set1(float v) { return vdupq_n_f32(v); }
  static F fma_i(I d, F s, F acc) { return vfmaq_f32(acc, cvt(d), s); }
  static float hsum(F v) { return vaddvq_f32(v); }
  // Lane k's block within a step, as int32 lanes (4 lanes: a step holds one block of 32 or
  // more columns, so this is all zeros, but the kernels ask for it all the same).
  static I lane_blocks(int64_t per_block) {
    int32_t idx[4];
    for (int k = 0; k < 4; ++k) idx[k] = int32_t(k / per_block);
    return s8(vld1q_s32(idx));
  }
  static F expand(const float* p, int n, I idx) {
    if (n == 1) return vdupq_n_f32(*p);
    int32_t k[4];
    vst1q_s32(k, s32(idx));
    const float v[4] = {p[k[0]], p[k[1]], p[k[2]], p[k[3]]};
    return vld1q_f32(v);
  }
};

}  // namespace loom::cpu::quant::neon

#define LOOM_QUANT_ISA neon
#include "loom/kernels/cpu/quant_vnni_impl.h"
#undef LOOM_QUANT_ISA

namespace loom::cpu::quant {

void quantize_acts_neon(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale, int32_t* sum,
                        int64_t m0, int64_t m1) {
  neon::quantize_acts<neon::Neon>(x, w, lay, q, scale, sum, m0, m1);
}

void int_rows_neon(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                   int64_t o1) {
  neon::int_rows<neon::Neon>(a, w, b, y, M, o0, o1);
}

}  // namespace loom::cpu::quant

#pragma GCC pop_options
