// The int8/int4/bf16 weight formats of quant_linear.h: validation, sizes, quantization and
// dequantization (the reference the kernels are tested against). No products here.
#include <algorithm>
#include <cmath>

#include "loom/core/dtype.h"
#include "loom/core/enum_names.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/quant_linear.h"
#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu {

const char* quant_format_name(QuantFormat f) {
  static constexpr EnumName<QuantFormat> kNames[] = {
      {QuantFormat::int8, "int8"}, {QuantFormat::int4, "int4"}, {QuantFormat::bf16, "bf16"}};
  return enum_name(kNames, f);
}

int64_t quant_row_bytes(QuantFormat f, int64_t I) {
  return f == QuantFormat::int8 ? I : f == QuantFormat::int4 ? I / 2 : 2 * I;
}

namespace quant {

void check_shape(QuantFormat f, int64_t O, int64_t I, int64_t group, bool zero_point) {
  const char* name = quant_format_name(f);
  LOOM_CHECK(O >= 0 && I > 0, "quant", name, " weights of ", O, " x ", I, ": need at least one input column");
  LOOM_CHECK(group > 0 && I % group == 0, "quant", "group=", group, " does not divide I=", I,
             ": use a group that divides the input width (e.g. 32, 64, 128), or group=I for one "
             "scale per output row");
  LOOM_CHECK(f != QuantFormat::int4 || group % 2 == 0, "quant", "int4 packs two weights per byte ", "but group=", group,
             " is odd: use an even group (e.g. 32, 64, 128)");
  LOOM_CHECK(f == QuantFormat::int4 || !zero_point, "quant", "zero points are for int4 only: quantize ", name,
             " without one (zero_point=false)");
  LOOM_CHECK(f != QuantFormat::bf16 || group == I, "quant", "bf16 weights have no scales, so no ",
             "groups: pass group=I (", I, "), not ", group);
}

}  // namespace quant

int64_t quant_bytes(QuantFormat f, int64_t O, int64_t I, int64_t group, bool zero_point) {
  quant::check_shape(f, O, I, group, zero_point);
  const int64_t packed = O * quant_row_bytes(f, I);
  if (f == QuantFormat::bf16) return packed;
  const int64_t groups = O * (I / group);
  return packed + groups * int64_t(sizeof(float)) * (zero_point ? 2 : 1);
}

void quantize_weights(const float* w, int64_t O, int64_t I, QuantFormat f, int64_t group, bool zero_point, uint8_t* q,
                      float* scales, float* offsets) {
  quant::check_shape(f, O, I, group, zero_point);
  if (f == QuantFormat::bf16) {
#pragma omp parallel for schedule(static) if (O * I > (1 << 20))
    for (int64_t k = 0; k < O * I; ++k) {
      const uint16_t bits = f32_to_bf16(w[k]).bits;
      std::memcpy(q + 2 * k, &bits, 2);
    }
    return;
  }
  const int64_t ng = I / group;
#pragma omp parallel for schedule(static) if (O * I > (1 << 20))
  for (int64_t o = 0; o < O; ++o) {
    for (int64_t g = 0; g < ng; ++g) {
      const float* src = w + o * I + g * group;
      float lo = 0, hi = 0;  // the range always contains 0
      for (int64_t i = 0; i < group; ++i) {
        lo = std::min(lo, src[i]);
        hi = std::max(hi, src[i]);
      }
      float scale;
      int zero = 0, qmin, qmax;
      if (zero_point) {
        scale = (hi - lo) / 15.f;
        if (scale > 0) zero = std::clamp(int(std::nearbyint(-lo / scale)), 0, 15);
        qmin = 0, qmax = 15;
      } else {
        const int levels = f == QuantFormat::int8 ? 127 : 7;
        scale = std::max(-lo, hi) / float(levels);
        qmin = -levels, qmax = levels;
      }
      scales[o * ng + g] = scale;
      if (zero_point) offsets[o * ng + g] = -scale * float(zero);
      for (int64_t i = 0; i < group; ++i) {
        const int v = scale > 0 ? std::clamp(int(std::nearbyint(src[i] / scale)) + zero, qmin, qmax) : zero;
        const int64_t col = g * group + i;
        if (f == QuantFormat::int8) {
          q[o * I + col] = uint8_t(int8_t(v));
        } else {
          uint8_t& byte = q[o * (I / 2) + col / 2];
          const uint8_t nib = uint8_t(v & 0xF);
          byte = col % 2 == 0 ? nib : uint8_t((byte & 0x0F) | (nib << 4));
        }
      }
    }
  }
}

void dequantize_weights(const QuantView& w, float* out) {
  quant::check_view(w);
  const int64_t O = w.rows, I = w.cols;
#pragma omp parallel for schedule(static) if (O * I > (1 << 20))
  for (int64_t o = 0; o < O; ++o) quant::dequantize_row(w, o, out + o * I);
}

namespace quant {

void check_view(const QuantView& w) {
  check_shape(w.format, w.rows, w.cols, w.group, w.offsets != nullptr);
  LOOM_CHECK(w.q && (w.scales || w.format == QuantFormat::bf16), "quant", quant_format_name(w.format),
             " weights: the view has no packed weights or scales (set QuantView::q and ::scales)");
}

void dequantize_row(const QuantView& w, int64_t o, float* out) {
  const int64_t I = w.cols, G = w.group, ng = I / G;
  if (w.format == QuantFormat::bf16) {
    const uint8_t* row = w.q + 2 * o * I;
    for (int64_t i = 0; i < I; ++i) {
      bf16_t v;
      std::memcpy(&v.bits, row + 2 * i, 2);
      out[i] = bf16_to_f32(v);
    }
    return;
  }
  for (int64_t g = 0; g < ng; ++g) {
    const float s = w.scales[o * ng + g];
    const float off = w.offsets ? w.offsets[o * ng + g] : 0.f;
    for (int64_t i = g * G; i < (g + 1) * G; ++i) {
      int v;
      if (w.format == QuantFormat::int8) {
        v = int8_t(w.q[o * I + i]);
      } else {
        const uint8_t byte = w.q[o * (I / 2) + i / 2];
        const int nib = i % 2 == 0 ? byte & 0xF : byte >> 4;
        v = w.offsets ? nib : (nib ^ 8) - 8;  // sign-extend the nibble
      }
      out[i] = w.offsets ? s * float(v) + off : s * float(v);  // (no + 0: it would turn -0 into +0)
    }
  }
}

}  // namespace quant
}  // namespace loom::cpu
