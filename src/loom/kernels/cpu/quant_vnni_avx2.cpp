// The integer-dot kernels of quant_vnni_impl.h for AVX-VNNI (AVX2 machines with the VEX
// vpdpbusd: Alder Lake and later, Zen 5): 32-byte chunks in ymm; block tails are copied into
// a zeroed buffer (AVX2 has no byte masks).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/kernels/cpu/quant_linear_impl.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni,bmi2")

namespace loom::cpu::quant::avx2 {

#include "loom/kernels/cpu/quant_vnni_ymm.h"

struct Ymm : YmmAvx2 {
  static constexpr int max_rows = 2;  // 16 registers: 2 x 4 int and float accumulators
  static constexpr int out_tile(int) { return 4; }
  static I dot(I acc, I u, I x) { return _mm256_dpbusd_avx_epi32(acc, u, x); }
  static I dot2(I acc, I u1, I x1, I u2, I x2) { return dot(dot(acc, u1, x1), u2, x2); }
};

// The many-rows kernel's products (quant_gemm_ymm.h).
struct GemmDot {
  using I = __m256i;
  using Acc = __m256i;
  static Acc u4(Acc a, I u, I x) { return _mm256_dpbusd_avx_epi32(a, u, x); }
  static Acc s8(Acc a, I abs_w, I signed_x) { return _mm256_dpbusd_avx_epi32(a, abs_w, signed_x); }
  static I finish(Acc a, bool) { return a; }
};

#include "loom/kernels/cpu/quant_gemm_ymm.h"

}  // namespace loom::cpu::quant::avx2

#define LOOM_QUANT_ISA avx2
#include "loom/kernels/cpu/quant_vnni_impl.h"
#undef LOOM_QUANT_ISA

namespace loom::cpu::quant {

void quantize_acts_avx2(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale, int32_t* sum,
                        int64_t m0, int64_t m1) {
  avx2::quantize_acts<avx2::Ymm>(x, w, lay, q, scale, sum, m0, m1);
}

void int_rows_avx2(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                   int64_t o1) {
  avx2::int_rows<avx2::Ymm>(a, w, b, y, M, o0, o1);
}

void ymm_gemm_item_avx_vnni(const int8_t* xq, const float* sx, const float* sxsum, const QuantView& w, const float* b,
                            float* y, int64_t M, int64_t item) {
  avx2::ymm_gemm::item<avx2::GemmDot>(xq, sx, sxsum, w, b, y, M, item);
}

}  // namespace loom::cpu::quant

#pragma GCC pop_options
