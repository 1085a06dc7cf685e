// Scalar math written so that loops over it vectorise: a branch-free exp for f32 (Cephes
// polynomial, about 2 ulp on [-87, 88]) and tanh/sigmoid built on it. f64 uses libm, so
// double-precision instantiations (gradient checks) stay exact.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace loom::cpu {

inline float exp_f32(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.0f ? 88.0f : x;
  const float t = x * 1.44269504088896341f + 12582912.0f;  // round(x / ln 2) via 1.5 * 2^23
  const float n = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

template <class T>
inline T vexp(T x);
template <>
inline float vexp<float>(float x) {
  return exp_f32(x);
}
template <>
inline double vexp<double>(double x) {
  return std::exp(x);
}

template <class T>
inline T vtanh(T x) {
  return T(1) - T(2) / (vexp<T>(T(2) * x) + T(1));
}
template <>
inline double vtanh<double>(double x) {
  return std::tanh(x);
}

template <class T>
inline T vsigmoid(T x) {
  return T(1) / (T(1) + vexp<T>(-x));
}

}  // namespace loom::cpu
