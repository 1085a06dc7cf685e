// Element types of tensors and the conversions between the 16-bit float formats and f32.
// Not a numeric library: arithmetic happens in f32/f64 inside kernels.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace loom {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, i8, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32", "float32", "bf16", ... ; throws "[dtype] unknown dtype 'x'".
DType dtype_from_name(const std::string& name);

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bf16_to_f32(bf16_t v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{uint16_t(u >> 16)};
}
float f16_to_f32(f16_t v);
f16_t f32_to_f16(float f);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<bf16_t>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16_t>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::i8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

// One element of any dtype to and from double, through f32 for the 16-bit floats.
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_to_f32(v);
  else if constexpr (std::is_same_v<T, f16_t>)
    return f16_to_f32(v);
  else
    return double(v);
}
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return f32_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, f16_t>)
    return f32_to_f16(float(v));
  else
    return T(v);
}

}  // namespace loom
