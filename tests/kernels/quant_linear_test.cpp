// int8/int4/bf16 weight quantization and quant_linear: the formats' error bounds and errors, and
// every kernel path this CPU can run against the f64 product with the dequantized weights
// (the f32 paths to rounding, the integer-dot paths within their activation-quantization
// bound). A disabled benchmark times gpt2-124m's matrices against f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/threads.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/decode_linear.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/quant_linear.h"
#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu {
namespace {

using quant::Path;

// A quantized matrix with its storage.
struct QuantMatrix {
  std::vector<uint8_t> q;
  std::vector<float> scales, offsets;
  QuantView view;

  // free_offsets (asymmetric int4): each group's offset then moves by up to half a step, as
  // GGUF's Q4_1 offsets (a group's minimum) do, so they are not -scale * an integer.
  QuantMatrix(const std::vector<float>& w, int64_t O, int64_t I, QuantFormat f, int64_t group, bool zero_point,
              bool free_offsets = false) {
    const int64_t ng = O * (I / group);
    q.resize(size_t(O * quant_row_bytes(f, I)));
    scales.resize(size_t(ng));
    if (zero_point) offsets.resize(size_t(ng));
    quantize_weights(w.data(), O, I, f, group, zero_point, q.data(), scales.data(),
                     zero_point ? offsets.data() : nullptr);
    view.format = f;
    view.rows = O, view.cols = I, view.group = group;
    view.q = q.data(), view.scales = scales.data();
    view.offsets = zero_point ? offsets.data() : nullptr;
    std::mt19937 g(99);
    std::uniform_real_distribution<float> shift(-0.5f, 0.5f);
    if (free_offsets)
      for (size_t k = 0; k < offsets.size(); ++k) offsets[k] += shift(g) * scales[k];
  }
  std::vector<float> dequantized() const {
    std::vector<float> out(size_t(view.rows * view.cols));
    dequantize_weights(view, out.data());
    return out;
  }
};

// Normal values with an outlier every 37th element, as activations and weights have.
std::vector<float> randn(size_t n, std::mt19937& g, float outlier = 8.f) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = d(g) * (i % 37 == 5 ? outlier : 1.f);
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Variant {
  QuantFormat format;
  bool zero_point;
  const char* name;
  bool free_offsets = false;
};
const Variant kVariants[] = {
    {QuantFormat::int8, false, "int8"}, {QuantFormat::int4, false, "int4"}, {QuantFormat::int4, true, "int4-zp"}};
// The products also take offsets that are not -scale * an integer (GGUF's Q4_1).
const Variant kProductVariants[] = {{QuantFormat::int8, false, "int8"},
                                    {QuantFormat::int4, false, "int4"},
                                    {QuantFormat::int4, true, "int4-zp"},
                                    {QuantFormat::int4, true, "int4-offsets", true}};

// ---- formats ------------------------------------------------------------------------------

TEST(QuantFormat, DequantizedWithinHalfAStepAndZeroPointsAreIntegers) {
  std::mt19937 g(1);
  const int64_t O = 9;
  for (const Variant& v : kVariants)
    for (auto [I, group] : {std::pair<int64_t, int64_t>{96, 32}, {200, 8}, {200, 200}, {384, 128}}) {
      SCOPED_TRACE(std::string(v.name) + " I=" + std::to_string(I) + " group=" + std::to_string(group));
      const std::vector<float> w = randn(size_t(O * I), g);
      const QuantMatrix qm(w, O, I, v.format, group, v.zero_point);
      EXPECT_EQ(quant_bytes(v.format, O, I, group, v.zero_point),
                int64_t(qm.q.size() + qm.scales.size() * 4 + qm.offsets.size() * 4));
      const std::vector<float> deq = qm.dequantized();
      const int64_t ng = I / group;
      for (int64_t o = 0; o < O; ++o)
        for (int64_t k = 0; k < ng; ++k) {
          const float s = qm.scales[size_t(o * ng + k)];
          for (int64_t i = k * group; i < (k + 1) * group; ++i) {
            const size_t at = size_t(o * I + i);
            ASSERT_LE(std::fabs(w[at] - deq[at]), s * 0.5f * (1 + 1e-5f)) << "o=" << o << " i=" << i;
          }
          if (v.zero_point) {  // the offset is -s * z for an integer z in [0, 15]
            const float z = -qm.offsets[size_t(o * ng + k)] / s;
            EXPECT_NEAR(z, std::nearbyint(z), 1e-5f);
            EXPECT_GE(std::nearbyint(z), 0);
            EXPECT_LE(std::nearbyint(z), 15);
          }
        }
    }
}

TEST(QuantFormat, ZeroPointRoundTripIsExact) {
  // w = s (n - z) with every group using nibbles 0 and 15: quantization gives back n and z.
  const int64_t O = 4, I = 64, group = 32;
  std::mt19937 g(2);
  std::uniform_int_distribution<int> nib(0, 15);
  std::vector<float> w(size_t(O * I));
  std::vector<int> want_z(size_t(O * I / group));
  for (int64_t o = 0; o < O; ++o)
    for (int64_t k = 0; k < I / group; ++k) {
      const int z = nib(g);
      want_z[size_t(o * (I / group) + k)] = z;
      const float s = 0.25f;
      for (int64_t i = 0; i < group; ++i) {
        const int n = i == 0 ? 0 : i == 1 ? 15 : nib(g);
        w[size_t(o * I + k * group + i)] = s * float(n - z);
      }
    }
  const QuantMatrix qm(w, O, I, QuantFormat::int4, group, true);
  const std::vector<float> deq = qm.dequantized();
  for (size_t k = 0; k < want_z.size(); ++k) EXPECT_FLOAT_EQ(qm.offsets[k], -0.25f * float(want_z[k])) << k;
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(deq[i], w[i], 1e-6) << i;
}

TEST(QuantFormat, AGroupOfZerosStoresZeros) {
  for (const Variant& v : kVariants) {
    std::vector<float> w(2 * 64, 0.f);
    for (int i = 64; i < 128; ++i) w[size_t(i)] = float(i - 96) / 8;  // second row nonzero
    const QuantMatrix qm(w, 2, 64, v.format, 32, v.zero_point);
    EXPECT_EQ(qm.scales[0], 0.f) << v.name;
    EXPECT_EQ(qm.scales[1], 0.f) << v.name;
    EXPECT_GT(qm.scales[2], 0.f) << v.name;
    const std::vector<float> deq = qm.dequantized();
    for (int i = 0; i < 64; ++i) EXPECT_EQ(deq[size_t(i)], 0.f) << v.name << " " << i;
  }
}

TEST(QuantFormat, PerChannelHasOneScalePerRow) {
  std::mt19937 g(3);
  const std::vector<float> w = randn(5 * 96, g);
  for (const Variant& v : kVariants) {
    const QuantMatrix qm(w, 5, 96, v.format, 96, v.zero_point);
    ASSERT_EQ(qm.scales.size(), 5u);
    for (int64_t o = 0; o < 5; ++o) {
      float hi = 0, lo = 0;
      for (int64_t i = 0; i < 96; ++i)
        hi = std::max(hi, w[size_t(o * 96 + i)]), lo = std::min(lo, w[size_t(o * 96 + i)]);
      const float want = v.zero_point ? (hi - lo) / 15 : std::max(hi, -lo) / (v.format == QuantFormat::int8 ? 127 : 7);
      EXPECT_FLOAT_EQ(qm.scales[size_t(o)], want) << v.name;
    }
  }
}

TEST(QuantFormat, BadGroupsAreRejectedWithTheFix) {
  std::vector<float> w(768);
  std::vector<uint8_t> q(768);
  std::vector<float> s(768), z(768);
  auto quantize = [&](QuantFormat f, int64_t I, int64_t group, bool zp) {
    return error_of([&] { quantize_weights(w.data(), 1, I, f, group, zp, q.data(), s.data(), z.data()); });
  };
  std::string e = quantize(QuantFormat::int8, 768, 40, false);
  EXPECT_NE(e.find("[quant] group=40 does not divide I=768"), std::string::npos) << e;
  EXPECT_NE(e.find("group=I"), std::string::npos) << e;
  e = quantize(QuantFormat::int4, 99, 33, false);
  EXPECT_NE(e.find("[quant] int4 packs two weights per byte but group=33 is odd"), std::string::npos) << e;
  e = quantize(QuantFormat::int8, 64, 32, true);
  EXPECT_NE(e.find("[quant] zero points are for int4 only"), std::string::npos) << e;
  e = quantize(QuantFormat::int8, 64, 0, false);
  EXPECT_NE(e.find("[quant] group=0 does not divide"), std::string::npos) << e;
  e = error_of([] { (void)quant_bytes(QuantFormat::int4, 8, 100, 30, false); });
  EXPECT_NE(e.find("group=30 does not divide I=100"), std::string::npos) << e;
  QuantView v;
  v.rows = 2, v.cols = 64, v.group = 32;
  float x[64] = {}, y[2];
  e = error_of([&] { quant_linear(x, v, nullptr, y, 1); });
  EXPECT_NE(e.find("[quant] int8 weights: the view has no packed weights"), std::string::npos) << e;
}

// ---- products on every path -----------------------------------------------------------------

class QuantLinearPath : public ::testing::TestWithParam<Path> {};

// y = x deq^T + b in f64, and sum |x| |deq| per output (the scale of its rounding error).
void reference(const std::vector<float>& x, const std::vector<float>& deq, const float* b, int64_t M, int64_t I,
               int64_t O, std::vector<double>& y, std::vector<double>& mag) {
  y.assign(size_t(M * O), 0.0);
  mag.assign(size_t(M * O), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < O; ++o) {
      double s = b ? b[o] : 0.0, a = 0;
      for (int64_t i = 0; i < I; ++i) {
        s += double(x[size_t(m * I + i)]) * deq[size_t(o * I + i)];
        a += std::fabs(double(x[size_t(m * I + i)]) * deq[size_t(o * I + i)]);
      }
      y[size_t(m * O + o)] = s, mag[size_t(m * O + o)] = a;
    }
}

// The integer paths' bound: x is rounded to steps of max|x_block| / 127, so each output moves
// by at most sum over blocks of (step / 2) * sum |deq| over the block.
std::vector<double> activation_bound(const std::vector<float>& x, const std::vector<float>& deq, const QuantView& w,
                                     Path p, int64_t M) {
  const quant::ActLayout lay = quant::act_layout(w, 32, false);  // blocks are split alike in all layouts
  const int64_t I = w.cols, O = w.rows, G = w.group;
  std::vector<double> out(size_t(M * O), 0.0);
  if (!quant::is_integer_path(p)) return out;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < I / G; ++g)
      for (int64_t kb = 0; kb < lay.blocks_per_group; ++kb) {
        const int64_t c0 = g * G + kb * lay.block, c1 = std::min((g + 1) * G, c0 + lay.block);
        double amax = 0;
        for (int64_t i = c0; i < c1; ++i) amax = std::max(amax, double(std::fabs(x[size_t(m * I + i)])));
        for (int64_t o = 0; o < O; ++o) {
          double a = 0;
          for (int64_t i = c0; i < c1; ++i) a += std::fabs(deq[size_t(o * I + i)]);
          out[size_t(m * O + o)] += amax / 127 / 2 * a;
        }
      }
  return out;
}

TEST_P(QuantLinearPath, MatchesTheDequantizedProduct) {
  const Path p = GetParam();
  if (quant::is_bf16_dot_path(p)) GTEST_SKIP() << "bf16 weights only: Bf16MatchesTheProductWithRoundedWeights";
  std::mt19937 g(7);
  // Shapes below, at and across the 32- and 64-byte vectors and the 128-column activation
  // blocks, in the stepped layout (256 and 384 columns: 1, 2 or 4 blocks per vector, one
  // scale per row, groups of 256 in blocks of 128) and the generic one (96, 160, 200, 448);
  // groups that are not whole vectors (8, 40) and one scale per row (group == I).
  const std::pair<int64_t, int64_t> shapes[] = {{96, 32},   {96, 96},   {160, 32},  {160, 160}, {200, 40},
                                                {200, 8},   {200, 200}, {256, 32},  {256, 64},  {384, 64},
                                                {384, 128}, {384, 384}, {448, 448}, {512, 256}, {576, 32}};
  double worst_rel = 0, worst_of_bound = 0, worst_norm = 0;
  int cases = 0;
  for (const Variant& v : kProductVariants)
    for (auto [I, group] : shapes) {
      if (v.format == QuantFormat::int4 && group % 2) continue;
      for (int64_t O : {1, 7, 33, 130}) {
        const std::vector<float> w = randn(size_t(O * I), g), bias = randn(size_t(O), g);
        const QuantMatrix qm(w, O, I, v.format, group, v.zero_point, v.free_offsets);
        const std::vector<float> deq = qm.dequantized();
        for (int64_t M : {1, 2, 3, 5, 17, 64, 65, 200}) {
          const bool with_bias = (M + O) % 2 == 1;
          SCOPED_TRACE(std::string(v.name) + " I=" + std::to_string(I) + " group=" + std::to_string(group) +
                       " O=" + std::to_string(O) + " M=" + std::to_string(M) + " bias=" + std::to_string(with_bias));
          const std::vector<float> x = randn(size_t(M * I), g);
          const float* b = with_bias ? bias.data() : nullptr;
          std::vector<double> want, mag;
          reference(x, deq, b, M, I, O, want, mag);
          const std::vector<double> act = activation_bound(x, deq, qm.view, p, M);
          std::vector<float> got(size_t(M * O), 1e30f);
          quant::quant_linear_with(p, x.data(), qm.view, b, got.data(), M);
          double err2 = 0, want2 = 0;
          for (size_t k = 0; k < got.size(); ++k) {
            const double err = std::fabs(got[k] - want[k]), bound = act[k] + 1e-5 * mag[k] + 1e-6;
            ASSERT_LE(err, bound) << "output " << k << ": got " << got[k] << " want " << want[k];
            worst_rel = std::max(worst_rel, err / mag[k]);
            worst_of_bound = std::max(worst_of_bound, err / bound);
            err2 += err * err, want2 += (want[k] - (b ? b[k % size_t(O)] : 0)) * (want[k] - (b ? b[k % size_t(O)] : 0));
          }
          worst_norm = std::max(worst_norm, std::sqrt(err2 / want2));
          ++cases;
        }
      }
    }
  std::printf(
      "[ %s ] %d cases: max |err| / sum|x||w| = %.2e, max err / bound = %.2f, "
      "max |y - ref| / |ref - b| (2-norms) = %.2e\n",
      quant::path_name(p), cases, worst_rel, worst_of_bound, worst_norm);
}

// The largest products the integer formats hold: int8 weights of +-127 and -128 (GGUF's Q8_0
// can store it), int4 nibbles of 7 and -8 (or 0 and 15 with offsets), each against an
// activation of the same sign quantized to +-127, so every partial sum is as large as it gets.
// x is +-1, which the activation quantization keeps exactly, so the kernel must give the
// dequantized product to f32 rounding; a 16-bit pair sum that saturates (AVX2's vpmaddubsw on
// w + 128) is off by thousands of steps.
TEST_P(QuantLinearPath, ExtremeProductsDoNotSaturate) {
  const Path p = GetParam();
  if (quant::is_bf16_dot_path(p)) GTEST_SKIP() << "bf16 weights only";
  const int64_t O = 6, M = 3;
  for (const Variant& v : kVariants)
    for (auto [I, group] : {std::pair<int64_t, int64_t>{256, 32}, {256, 256}, {200, 40}}) {
      SCOPED_TRACE(std::string(v.name) + " I=" + std::to_string(I) + " group=" + std::to_string(group));
      const int64_t ng = I / group;
      std::vector<uint8_t> q(size_t(O * quant_row_bytes(v.format, I)));
      std::vector<float> scales(size_t(O * ng)), offsets(v.zero_point ? size_t(O * ng) : 0), w(size_t(O * I));
      for (size_t k = 0; k < scales.size(); ++k) scales[k] = 0.01f * float(1 + k % 5);
      for (size_t k = 0; k < offsets.size(); ++k) offsets[k] = -8 * scales[k];
      for (int64_t o = 0; o < O; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const bool neg = (i / 3 + o) % 2 == 1;  // runs of three of each sign
          int32_t n;                              // the stored integer
          if (v.format == QuantFormat::int8)
            n = neg ? (i % 2 ? -128 : -127) : 127;
          else
            n = v.zero_point ? (neg ? 0 : 15) : (neg ? -8 : 7);
          const float s = scales[size_t(o * ng + i / group)];
          w[size_t(o * I + i)] = s * float(n) + (v.zero_point ? offsets[size_t(o * ng + i / group)] : 0.f);
          if (v.format == QuantFormat::int8) {
            q[size_t(o * I + i)] = uint8_t(int8_t(n));
          } else {
            uint8_t& byte = q[size_t(o * (I / 2) + i / 2)];
            byte = uint8_t(byte | (uint8_t(n & 0xF) << (i % 2 ? 4 : 0)));
          }
        }
      QuantView view;
      view.format = v.format, view.rows = O, view.cols = I, view.group = group;
      view.q = q.data(), view.scales = scales.data(), view.offsets = v.zero_point ? offsets.data() : nullptr;
      std::vector<float> x(size_t(M * I)), y(size_t(M * O));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < I; ++i) x[size_t(m * I + i)] = w[size_t((m % O) * I + i)] < 0 ? -1.f : 1.f;
      quant::quant_linear_with(p, x.data(), view, nullptr, y.data(), M);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t o = 0; o < O; ++o) {
          double want = 0, mag = 0;
          for (int64_t i = 0; i < I; ++i) {
            want += double(x[size_t(m * I + i)]) * w[size_t(o * I + i)];
            mag += std::fabs(w[size_t(o * I + i)]);
          }
          ASSERT_NEAR(y[size_t(m * O + o)], want, 1e-5 * mag) << "row " << m << " output " << o;
        }
    }
}

// Below the many-rows switch (BLAS on the f32 paths, the repacked kernels on the integer ones) a
// row's output is bitwise the same whatever the batch around it.
TEST_P(QuantLinearPath, ARowsResultDoesNotDependOnTheRowCount) {
  const Path p = GetParam();
  std::mt19937 g(8);
  const int64_t I = 256, O = 37;
  const int64_t M = p == Path::avx512_vnni                       ? quant::kGemmMinRows - 1
                    : p == Path::avx2_int || p == Path::avx_vnni ? quant::kYmmGemmMinRows - 1
                                                                 : kQuantBlasMinRows;
  const Variant bf16{QuantFormat::bf16, false, "bf16"};
  std::vector<Variant> variants;
  if (!quant::is_bf16_dot_path(p)) variants.assign(std::begin(kProductVariants), std::end(kProductVariants));
  if (!quant::is_integer_path(p)) variants.push_back(bf16);
  for (const Variant& v : variants) {
    const QuantMatrix qm(randn(size_t(O * I), g), O, I, v.format, v.format == QuantFormat::bf16 ? I : 64, v.zero_point,
                         v.free_offsets);
    const std::vector<float> x = randn(size_t(M * I), g);
    std::vector<float> all(static_cast<size_t>(M * O)), one(static_cast<size_t>(O));
    quant::quant_linear_with(p, x.data(), qm.view, nullptr, all.data(), M);
    for (int64_t m = 0; m < M; ++m) {
      quant::quant_linear_with(p, x.data() + m * I, qm.view, nullptr, one.data(), 1);
      ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + m * O)) << v.name << " row " << m;
    }
  }
}

// The fast (stepped) layout must cover the shapes models use, or the timings do not apply.
TEST(QuantLinear, Gpt2ShapesTakeTheSteppedKernels) {
  for (int64_t I : {768, 3072})
    for (const Variant& v : kProductVariants)
      for (int64_t group : {int64_t(32), int64_t(64), int64_t(128), I}) {
        QuantView w;
        w.format = v.format, w.rows = 8, w.cols = I, w.group = group;
        if (v.zero_point) w.offsets = reinterpret_cast<const float*>(&w);  // only tested for null
        for (int64_t chunk : {16, 32, 64})
          EXPECT_TRUE(quant::act_layout(w, chunk).stepped)
              << v.name << " I=" << I << " group=" << group << " chunk=" << chunk;
      }
}

// Above it, the integer paths quantize x the same way, so rows agree to f32 rounding.
TEST_P(QuantLinearPath, ManyRowsAgreeWithSingleRowsToRounding) {
  const Path p = GetParam();
  if (quant::is_bf16_dot_path(p)) GTEST_SKIP() << "bf16 weights only; few rows round x to bf16 there, BLAS does not";
  std::mt19937 g(10);
  const int64_t M = 200;
  for (auto [I, O] : {std::pair<int64_t, int64_t>{256, 37}, {768, 130}})
    for (const Variant& v : kProductVariants)
      for (int64_t group : {int64_t(32), int64_t(64), I}) {
        const QuantMatrix qm(randn(size_t(O * I), g), O, I, v.format, group, v.zero_point, v.free_offsets);
        const std::vector<float> x = randn(size_t(M * I), g), bias = randn(size_t(O), g);
        const std::vector<float> deq = qm.dequantized();
        std::vector<float> all(static_cast<size_t>(M * O)), one(static_cast<size_t>(O));
        quant::quant_linear_with(p, x.data(), qm.view, bias.data(), all.data(), M);
        for (int64_t m = 0; m < M; m += 7) {
          quant::quant_linear_with(p, x.data() + m * I, qm.view, bias.data(), one.data(), 1);
          for (int64_t o = 0; o < O; ++o) {
            // The few-rows kernels convert per-lane sums of unsigned weights u = v + z (z = 128
            // for int8, 8 for int4; the nibble itself with offsets) to f32 before the shift
            // z * sum(x) (or the offset's term) comes back off, so their f32 terms are bounded by
            // sum |x| (|w| + shift), shift = z * scale or |offset|, not by sum |x w|.
            double mag = std::fabs(bias[size_t(o)]);
            for (int64_t i = 0; i < I; ++i) {
              const size_t k = size_t(o * (I / group) + i / group);
              const double shift =
                  v.zero_point ? std::fabs(qm.offsets[k]) : qm.scales[k] * (v.format == QuantFormat::int8 ? 128 : 8);
              mag += std::fabs(double(x[size_t(m * I + i)])) * (std::fabs(deq[size_t(o * I + i)]) + shift);
            }
            ASSERT_NEAR(all[size_t(m * O + o)], one[size_t(o)], 2e-6 * mag)
                << v.name << " I=" << I << " group=" << group << " row " << m << " output " << o;
          }
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Runnable, QuantLinearPath, ::testing::ValuesIn(quant::runnable_paths()),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           std::string n = quant::path_name(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// bf16 weights: every f32 path against the f64 product with the rounded weights, on shapes
// below, at and across the vector widths, few rows and many (BLAS on widened blocks); the
// avx512-bf16 path within the bound of rounding x to bf16 (|dx| <= 2^-8 |x|) for few rows; the
// integer paths refuse them.
TEST_P(QuantLinearPath, Bf16MatchesTheProductWithRoundedWeights) {
  const Path p = GetParam();
  std::mt19937 g(11);
  for (int64_t I : {16, 40, 96, 200, 256, 768})
    for (int64_t O : {1, 7, 33, 130}) {
      const std::vector<float> w = randn(size_t(O * I), g), bias = randn(size_t(O), g);
      const QuantMatrix qm(w, O, I, QuantFormat::bf16, I, false);
      const std::vector<float> deq = qm.dequantized();
      for (int64_t M : {1, 3, 5, 33, 70}) {
        SCOPED_TRACE("I=" + std::to_string(I) + " O=" + std::to_string(O) + " M=" + std::to_string(M));
        const std::vector<float> x = randn(size_t(M * I), g);
        std::vector<float> got(size_t(M * O), 1e30f);
        if (quant::is_integer_path(p)) {
          const std::string e =
              error_of([&] { quant::quant_linear_with(p, x.data(), qm.view, nullptr, got.data(), M); });
          EXPECT_NE(e.find("bf16 weights take an f32 or the avx512-bf16 path"), std::string::npos) << e;
          continue;
        }
        std::vector<double> want, mag;
        reference(x, deq, bias.data(), M, I, O, want, mag);
        quant::quant_linear_with(p, x.data(), qm.view, bias.data(), got.data(), M);
        const double rel = quant::is_bf16_dot_path(p) && M <= kQuantBlasMinRows ? 1.0 / 256 + 1e-5 : 1e-5;
        for (size_t k = 0; k < got.size(); ++k)
          ASSERT_LE(std::fabs(got[k] - want[k]), rel * mag[k] + 1e-6) << "output " << k;
      }
    }
}

TEST(QuantFormat, Bf16RoundsEachWeightToNearestEven) {
  std::mt19937 g(12);
  const int64_t O = 5, I = 48;
  std::vector<float> w = randn(size_t(O * I), g);
  w[3] = 1.f + 1.f / 256;       // a tie: rounds to the even neighbour, 1
  w[4] = 1.f + 3.f / 256;       // a tie: rounds up to 1 + 1/64
  w[5] = -0.f, w[6] = 3.0e38f;  // sign and the top of the range survive
  const QuantMatrix qm(w, O, I, QuantFormat::bf16, I, false);
  EXPECT_EQ(quant_bytes(QuantFormat::bf16, O, I, I, false), 2 * O * I);
  EXPECT_EQ(int64_t(qm.q.size()), 2 * O * I);
  const std::vector<float> deq = qm.dequantized();
  for (size_t k = 0; k < w.size(); ++k) {
    EXPECT_EQ(deq[k], loom::bf16_to_f32(loom::f32_to_bf16(w[k]))) << k;
    EXPECT_LE(std::fabs(deq[k] - w[k]), std::fabs(w[k]) / 256) << k;  // half a step of 8 bits
  }
  EXPECT_EQ(deq[3], 1.f);
  EXPECT_EQ(deq[4], 1.f + 1.f / 64);
  EXPECT_TRUE(std::signbit(deq[5]));
  std::vector<uint8_t> q(size_t(2 * O * I));
  std::string e =
      error_of([&] { quantize_weights(w.data(), O, I, QuantFormat::bf16, 16, false, q.data(), nullptr, nullptr); });
  EXPECT_NE(e.find("[quant] bf16 weights have no scales, so no groups: pass group=I (48), not 16"), std::string::npos)
      << e;
  e = error_of([&] { quantize_weights(w.data(), O, I, QuantFormat::bf16, I, true, q.data(), nullptr, nullptr); });
  EXPECT_NE(e.find("zero points are for int4 only: quantize bf16 without one"), std::string::npos) << e;
}

TEST(QuantLinear, TakesTheNamedPath) {
  for (QuantFormat f : {QuantFormat::int8, QuantFormat::int4, QuantFormat::bf16}) {
    const std::string name = quant_linear_path(f);
    bool found = false;
    for (Path p : quant::runnable_paths()) found |= name == quant::path_name(p);
    EXPECT_TRUE(found) << name;
    // The f32 kernels' instruction set (LOOM_ISA) decides the family; on aarch64 (isa base)
    // int8/int4 take sdot where the CPU has it.
    const std::string isa = hot_kernels_isa();
    const bool sdot = f != QuantFormat::bf16 && quant::path_runs_here(Path::neon_dot);
    const std::string family = isa == "avx2" ? "avx" : isa == "base" && sdot ? "neon" : isa;
    EXPECT_EQ(name.rfind(family, 0), 0u) << name;
  }
  std::mt19937 g(9);
  const QuantMatrix qm(randn(64 * 128, g), 64, 128, QuantFormat::int4, 32, false);
  const std::vector<float> x = randn(3 * 128, g);
  std::vector<float> a(3 * 64), b(3 * 64);
  quant_linear(x.data(), qm.view, nullptr, a.data(), 3);
  quant::quant_linear_with(quant::default_path(QuantFormat::int4), x.data(), qm.view, nullptr, b.data(), 3);
  EXPECT_EQ(a, b);
}

// ---- benchmark ------------------------------------------------------------------------------

double seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Cheap distinct pseudo-random values (the benchmark allocates ~1 GB of weights).
void fill(std::vector<float>& v, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (float& e : v) {
    s = s * 1664525u + 1013904223u;
    e = float(int32_t(s >> 8) - (1 << 23)) * (0.05f / float(1 << 23));
  }
}

struct BenchMatrix {
  const char* name;
  int64_t O, I, count;  // count: how many a gpt2-124m decode step uses
};
constexpr BenchMatrix kGpt2[] = {{"qkv", 2304, 768, 12},
                                 {"proj", 768, 768, 12},
                                 {"fc", 3072, 768, 12},
                                 {"out", 768, 3072, 12},
                                 {"head", 50257, 768, 1}};
struct BenchFormat {
  const char* name;
  QuantFormat format;
  int64_t group;  // 0: one scale per row
  bool zero_point;
};
constexpr BenchFormat kBenchFormats[] = {
    {"int8/ch", QuantFormat::int8, 0, false},    {"int8/g64", QuantFormat::int8, 64, false},
    {"int4/g64", QuantFormat::int4, 64, false},  {"int4/g32", QuantFormat::int4, 32, false},
    {"int4zp/g32", QuantFormat::int4, 32, true}, {"bf16", QuantFormat::bf16, 0, false}};

// Read bandwidth on the benchmark's threads: the best of three sums over 1 GiB (as `loom bench
// infer` measures the batch-1 decode bound).
double read_gbps() {
  static std::vector<float> buf(size_t(1) << 28, 1.0f);
  double best = 0, sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    double total = 0;
    const int64_t n = int64_t(buf.size());
#pragma omp parallel for schedule(dynamic, 16) reduction(+ : total)
    for (int64_t c = 0; c < n; c += 4096) {
      float acc[16] = {};
      for (int64_t j = c; j < c + 4096; j += 16)
        for (int k = 0; k < 16; ++k) acc[k] += buf[size_t(j + k)];
      for (float a : acc) total += a;
    }
    best = std::max(best, double(n) * 4 / seconds(t0) / 1e9);
    sink += total;
  }
  EXPECT_EQ(sink, 3.0 * double(buf.size()));
  return best;
}

// gpt2-124m's matrices on 2 threads: a whole decode step (M = 1: each of the 49 matrices
// streamed from its own memory, as the model does) or prompt processing (M = 512, one matrix
// of each kind), f32 against each format on the integer and f32 paths, medians over
// repetitions interleaved so that load on the machine hits every variant alike.
//   test_kernels --gtest_also_run_disabled_tests --gtest_filter='QuantLinearBench.*'
void gpt2_bench(int64_t M) {
  set_num_threads(2);
  char cpu[256] = "?";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (!std::strncmp(line, "model name", 10)) {
        std::snprintf(cpu, sizeof cpu, "%s", std::strchr(line, ':') + 2);
        cpu[std::strcspn(cpu, "\n")] = 0;
        break;
      }
    std::fclose(f);
  }
  std::printf("%s, %d threads, OpenBLAS core %s; default paths: int8 %s, int4 %s\n", cpu, num_threads(),
              openblas_get_corename(), quant_linear_path(QuantFormat::int8).c_str(),
              quant_linear_path(QuantFormat::int4).c_str());

  // A config is a format on a path; formats null: f32 decode_linear (M = 1) or BLAS.
  struct Config {
    std::string name;
    const BenchFormat* fmt;
    Path path;
    bool decode_linear;
  };
  std::vector<Config> decode{{"f32 decode_linear", nullptr, Path::base_f32, true},
                             {"f32 BLAS", nullptr, Path::base_f32, false}};
  std::vector<Config> prompt{{"f32 BLAS", nullptr, Path::base_f32, false}};
  for (const BenchFormat& f : kBenchFormats)
    for (Path p : quant::runnable_paths()) {
      if ((f.format == QuantFormat::bf16) == quant::is_integer_path(p)) continue;
      if (f.format != QuantFormat::bf16 && quant::is_bf16_dot_path(p)) continue;
      const Config c{std::string(f.name) + " " + quant::path_name(p), &f, p, false};
      if (p != Path::base_f32) decode.push_back(c);
      if (quant::is_integer_path(p) || p == Path::avx512_f32) prompt.push_back(c);
    }

  // Weights: every matrix of the model, f32 and in each format.
  std::vector<const BenchMatrix*> step;
  for (int layer = 0; layer < 12; ++layer)
    for (int k = 0; k < 4; ++k) step.push_back(&kGpt2[k]);
  step.push_back(&kGpt2[4]);
  std::vector<std::vector<float>> f32(step.size());
  std::vector<std::vector<std::unique_ptr<QuantMatrix>>> qm(std::size(kBenchFormats));
  for (size_t j = 0; j < step.size(); ++j) {
    f32[j].resize(size_t(step[j]->O * step[j]->I));
    fill(f32[j], uint32_t(j));
    for (size_t k = 0; k < std::size(kBenchFormats); ++k) {
      const BenchFormat& f = kBenchFormats[k];
      qm[k].push_back(std::make_unique<QuantMatrix>(f32[j], step[j]->O, step[j]->I, f.format,
                                                    f.group ? f.group : step[j]->I, f.zero_point));
    }
  }
  auto bytes_of = [&](const Config& c, const BenchMatrix& m) {
    return c.fmt ? double(quant_bytes(c.fmt->format, m.O, m.I, c.fmt->group ? c.fmt->group : m.I, c.fmt->zero_point))
                 : double(m.O * m.I * 4);
  };
  auto run = [&](const Config& c, size_t j, const float* x, float* y, int64_t M) {
    const BenchMatrix& m = *step[j];
    if (c.decode_linear)
      cpu::decode_linear(x, f32[j].data(), nullptr, y, M, m.I, m.O);
    else if (!c.fmt)
      linear_forward<float>(x, f32[j].data(), nullptr, y, M, m.I, m.O);
    else
      quant::quant_linear_with(c.path, x, qm[size_t(c.fmt - kBenchFormats)][j]->view, nullptr, y, M);
  };
  std::mt19937 g(5);

  // QUANT_BENCH_ONLY=a,b keeps the configs whose names contain one of the comma-separated words.
  std::vector<Config> configs = M == 1 ? decode : prompt;
  if (const char* only = std::getenv("QUANT_BENCH_ONLY"); only && *only) {
    std::vector<Config> kept;
    for (const Config& c : configs) {
      std::string words = only;
      for (size_t at = 0; at != std::string::npos;) {
        const size_t comma = words.find(',', at);
        const std::string word = words.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (!word.empty() && c.name.find(word) != std::string::npos) {
          kept.push_back(c);
          break;
        }
        at = comma == std::string::npos ? comma : comma + 1;
      }
    }
    configs = kept;
  }
  const std::vector<float> x = randn(size_t(M * 3072), g);
  std::vector<float> y(size_t(M * 50257));
  // seconds[config][matrix kind], one entry per repetition
  std::vector<std::vector<std::vector<double>>> times(configs.size(), std::vector<std::vector<double>>(5));
  const int reps = M == 1 ? 15 : 3;
  const double bw_before = M == 1 ? read_gbps() : 0;
  for (int rep = 0; rep < reps + 1; ++rep)
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      double t[5] = {};
      for (size_t j = 0; j < step.size(); ++j) {
        if (M > 1 && j >= 4 && j != step.size() - 1) continue;  // one matrix per kind
        const auto t0 = std::chrono::steady_clock::now();
        run(configs[ci], j, x.data(), y.data(), M);
        t[step[j] - kGpt2] += seconds(t0);
      }
      if (rep > 0)  // the first is a warm-up
        for (size_t k = 0; k < 5; ++k) times[ci][k].push_back(t[k]);
    }
  const double bw = M == 1 ? std::max(bw_before, read_gbps()) : 0;
  if (M == 1)
    std::printf(
        "\nM = 1, a whole decode step (median of %d); read bandwidth %.1f GB/s; per kind: ms per "
        "matrix and GB/s of weights\n",
        reps, bw);
  else
    std::printf("\nM = 512 (median of %d); per kind: ms and GMAC/s; model: 12 layers + head\n", reps);
  std::printf("%-24s", "config");
  for (const BenchMatrix& m : kGpt2) std::printf(" %8s %6s", m.name, M == 1 ? "GB/s" : "GMAC/s");
  std::printf(" | %9s %6s%s\n", "model ms", "x f32", M == 1 ? "   GB/s  of bound" : "");
  double f32_model = 0;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const Config& c = configs[ci];
    std::printf("%-24s", c.name.c_str());
    double model = 0, model_bytes = 0;
    for (size_t k = 0; k < 5; ++k) {
      const BenchMatrix& m = kGpt2[k];
      const double per = median(times[ci][k]) / double(M == 1 ? m.count : 1);  // one matrix
      model += per * double(m.count), model_bytes += bytes_of(c, m) * double(m.count);
      std::printf(" %8.3f %6.1f", per * 1e3, M == 1 ? bytes_of(c, m) / per / 1e9 : double(M * m.O * m.I) / per / 1e9);
    }
    if (ci == 0) f32_model = model;
    std::printf(" | %9.2f %5.2fx", model * 1e3, f32_model / model);
    if (M == 1) std::printf(" %6.1f %7.0f%%", model_bytes / model / 1e9, 100 * model_bytes / (bw * 1e9) / model);
    std::printf("\n");
  }
}

TEST(QuantLinearBench, DISABLED_Gpt2Decode) { gpt2_bench(1); }
TEST(QuantLinearBench, DISABLED_Gpt2Prompt) { gpt2_bench(512); }

}  // namespace
}  // namespace loom::cpu
