#include "loom/core/dtype.h"

#include "loom/core/enum_names.h"
#include "loom/core/error.h"

namespace loom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::i8:
    case DType::u8: return 1;
  }
  return 0;
}

namespace {
// Each dtype's printed name first, then the long and the safetensors spellings accepted too.
constexpr EnumName<DType> kDTypeNames[] = {
    {DType::f32, "f32"},     {DType::f64, "f64"},     {DType::bf16, "bf16"},     {DType::f16, "f16"},
    {DType::i32, "i32"},     {DType::i64, "i64"},     {DType::i8, "i8"},         {DType::u8, "u8"},
    {DType::f32, "float32"}, {DType::f64, "float64"}, {DType::bf16, "bfloat16"}, {DType::f16, "float16"},
    {DType::i32, "int32"},   {DType::i64, "int64"},   {DType::i8, "int8"},       {DType::u8, "uint8"},
    {DType::f32, "F32"},     {DType::f64, "F64"},     {DType::bf16, "BF16"},     {DType::f16, "F16"},
    {DType::i32, "I32"},     {DType::i64, "I64"},     {DType::i8, "I8"},         {DType::u8, "U8"}};
}  // namespace

const char* dtype_name(DType t) { return enum_name(kDTypeNames, t); }

DType dtype_from_name(const std::string& n) {
  if (const auto t = enum_from_name(kDTypeNames, n)) return *t;
  fail("dtype", "unknown dtype '", n, "' (expected f32, f64, bf16, f16, i32, i64, i8 or u8)");
}

// IEEE half <-> single, with subnormals, infinities and NaN; round to nearest even.
float f16_to_f32(f16_t v) {
  uint32_t h = v.bits;
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return f16_t{uint16_t(sign | 0x7c00u | (man ? 0x200u : 0))};
  if (exp >= 31) return f16_t{uint16_t(sign | 0x7c00u)};
  if (exp <= 0) {
    if (exp < -10) return f16_t{uint16_t(sign)};
    man |= 0x800000u;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return f16_t{uint16_t(sign | half)};
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;  // may carry into exponent: correct
  return f16_t{uint16_t(half)};
}

}  // namespace loom
