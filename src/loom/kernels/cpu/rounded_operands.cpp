#include "loom/kernels/cpu/rounded_operands.h"

#include <cstring>

#include "loom/core/dtype.h"
#include "loom/core/tensor.h"

namespace loom::cpu {

const char* product_precision_name(ProductPrecision p) {
  return p == ProductPrecision::bf16 ? "bf16" : p == ProductPrecision::f16 ? "f16" : "f32";
}

void round_to_bf16(const float* in, float* out, int64_t n) {
  // f32_to_bf16 on the bit pattern, written so that GCC vectorizes it: add half an ulp of bf16
  // plus the tie bit, clear the low half; NaNs keep their payload's top (and stay NaN).
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, 4);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t v = nan ? (u | 0x00400000u) & 0xffff0000u : r;
    std::memcpy(out + i, &v, 4);
  }
}

void round_to_f16(const float* in, float* out, int64_t n) {
  // f16_to_f32(f32_to_f16(x)) without branches, so that GCC vectorizes it. Normal range: round
  // the mantissa to 10 bits as round_to_bf16 does to 7; past 65504 that gives infinity. Below
  // 2^-14 the f16 grid is multiples of 2^-24, which is the grid of floats in [0.5, 1): adding
  // and subtracting 0.5 rounds to it, nearest even. NaNs become the quiet NaN f32_to_f16 makes.
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, 4);
    const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
    normal = normal > 0x477fe000u ? 0x7f800000u : normal;
    float mag;
    std::memcpy(&mag, &a, 4);
    const float sub_f = (mag + 0.5f) - 0.5f;
    uint32_t sub;
    std::memcpy(&sub, &sub_f, 4);
    const uint32_t r = a > 0x7f800000u ? 0x7fc00000u : a < 0x38800000u ? sub : normal;
    const uint32_t v = sign | r;
    std::memcpy(out + i, &v, 4);
  }
}

void narrow_to_16(bool bf16, const float* in, uint16_t* out, int64_t n) {
  if (bf16) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, in + i, 4);
      const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
      const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      out[i] = uint16_t(nan ? (u >> 16) | 0x40u : r);
    }
    return;
  }
  // round_to_f16's rounding, then the bits: normal values rebias the exponent (f32's 113 is
  // fp16's 1), subnormals are the multiple of 2^-24 they were rounded to.
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
    normal = normal > 0x477fe000u ? 0x7c00u : (normal - 0x38000000u) >> 13;
    float mag;
    std::memcpy(&mag, &a, 4);
    const uint32_t sub = uint32_t(((mag + 0.5f) - 0.5f) * 16777216.f);
    const uint32_t h = a > 0x7f800000u ? 0x7e00u : a == 0x7f800000u ? 0x7c00u : a < 0x38800000u ? sub : normal;
    out[i] = uint16_t(sign | h);
  }
}

void widen_from_16(bool bf16, const uint16_t* in, float* out, int64_t n) {
  if (bf16) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(in[i]) << 16;
      std::memcpy(out + i, &u, 4);
    }
    return;
  }
  // The magnitude's bits shifted into f32 position and scaled by 2^112 rebias normal and
  // subnormal values alike; infinities and NaNs keep an all-ones exponent.
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = in[i], bits = (h & 0x7fffu) << 13;
    float f;
    std::memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    uint32_t v;
    std::memcpy(&v, &f, 4);
    v = (h & 0x7c00u) == 0x7c00u ? bits | 0x7f800000u : v;
    v |= (h & 0x8000u) << 16;
    std::memcpy(out + i, &v, 4);
  }
}

void round_operand(ProductPrecision p, const float* in, float* out, int64_t n) {
  if (p == ProductPrecision::bf16)
    round_to_bf16(in, out, n);
  else if (p == ProductPrecision::f16)
    round_to_f16(in, out, n);
  else if (in != out)
    std::memcpy(out, in, size_t(n) * sizeof(float));
}

const float* rounded_operand(ProductPrecision prec, int slot, const float* p, int64_t n) {
  if (prec == ProductPrecision::f32) return p;
  // Workspace of the process allocator (memory_stats() shows it): the largest operand seen per
  // slot, e.g. an LM head's weights.
  thread_local Tensor scratch[3];
  Tensor& s = scratch[slot];
  if (!s.defined() || s.numel() < n) {
    s = Tensor();
    s = Tensor::empty({n}, DType::f32, MemCategory::workspace);
  }
  round_operand(prec, p, s.data<float>(), n);
  return s.data<float>();
}

}  // namespace loom::cpu
