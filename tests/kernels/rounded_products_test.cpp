// 16-bit products (ProductPrecision::bf16/f16, kernels/cpu/rounded_operands.h): the roundings equal
// the scalar f32_to_bf16 / f32_to_f16 bit for bit (fp16 saturating to infinity); linear forward/backward and the fused
// LM head + loss equal the f64 products of the rounded operands up to f32 accumulation (the head's backward within the
// rounding of its f32 dlogits), differ from the f32 path by about the rounding (so the policy is applied), and f64
// tensors are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/kernels/ops.h"
#include "testing/errors.h"
#include "testing/gradcheck.h"

using namespace loom;

namespace {

float rounded(float v) { return bf16_to_f32(f32_to_bf16(v)); }

std::vector<double> rounded_f64(const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = rounded(t.data<float>()[i]);
  return out;
}

// C[M,N] = A[M,K] B^T (B [N,K]) or A B (B [K,N]) in f64, with sum |a||b| per output.
void product(const std::vector<double>& A, const std::vector<double>& B, int64_t M, int64_t N, int64_t K,
             bool b_transposed, std::vector<double>& C, std::vector<double>& mag) {
  C.assign(size_t(M * N), 0.0);
  mag.assign(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const double p = A[size_t(m * K + k)] * (b_transposed ? B[size_t(n * K + k)] : B[size_t(k * N + n)]);
        C[size_t(m * N + n)] += p;
        mag[size_t(m * N + n)] += std::fabs(p);
      }
}

std::vector<double> transpose(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
  return t;
}

// Every element within rel * mag of the reference; returns the largest |got - f32 path| / mag.
void expect_products(const char* what, const Tensor& got, const std::vector<double>& want,
                     const std::vector<double>& mag, double rel) {
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_LE(std::fabs(got.data<float>()[i] - want[size_t(i)]), rel * mag[size_t(i)] + 1e-6)
        << what << " element " << i << ": got " << got.data<float>()[i] << " want " << want[size_t(i)];
}

double max_rel_diff(const Tensor& a, const Tensor& b, const std::vector<double>& mag) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(double(a.data<float>()[i]) - b.data<float>()[i]) / (mag[size_t(i)] + 1e-30));
  return worst;
}

}  // namespace

TEST(RoundToBf16, MatchesTheScalarConversionBitForBit) {
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v;
  for (int i = 0; i < 10000; ++i) v.push_back(d(g) * std::ldexp(1.f, i % 60 - 30));
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                        0x7fc00001u, 0x7f800001u, 0xffa00000u, 0x00000001u, 0x807fffffu, 0x00000000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  std::vector<float> out(v.size());
  cpu::round_to_bf16(v.data(), out.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t got, want = uint32_t(f32_to_bf16(v[i]).bits) << 16;
    std::memcpy(&got, &out[i], 4);
    ASSERT_EQ(got, want) << "input " << v[i] << " (element " << i << ")";
  }
  cpu::round_to_bf16(v.data(), v.data(), int64_t(v.size()));  // in place
  EXPECT_EQ(0, std::memcmp(v.data(), out.data(), v.size() * 4));
}

TEST(RoundToF16, MatchesTheScalarConversionAndSaturates) {
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v;
  for (int i = 0; i < 5000; ++i) v.push_back(d(g) * std::ldexp(1.f, i % 40 - 25));  // subnormals to beyond range
  v.push_back(65504.f);
  v.push_back(65520.f);  // rounds up past the largest fp16: infinity
  v.push_back(-1e6f);
  std::vector<float> out(v.size());
  cpu::round_to_f16(v.data(), out.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i], f16_to_f32(f32_to_f16(v[i]))) << v[i];
  EXPECT_EQ(out[v.size() - 3], 65504.f);
  EXPECT_TRUE(std::isinf(out[v.size() - 2]));
  EXPECT_TRUE(std::isinf(out[v.size() - 1]) && out[v.size() - 1] < 0);
}

TEST(RoundToF16, MatchesTheScalarConversionBitForBitOverTheWholeRange) {
  // Every 997th bit pattern (all exponents, both signs, NaNs and infinities) and the edges of
  // the branches: the smallest normal f16, subnormal and normal ties, the rounding into
  // infinity.
  std::vector<uint32_t> bits;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 997) bits.push_back(uint32_t(b));
  for (uint32_t e : {0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33c00000u, 0x3f801000u,
                     0x3f803000u, 0x3f800fffu, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x7f800000u, 0x7f800001u,
                     0x7fffffffu, 0x00000001u, 0x80000000u})
    for (uint32_t s : {0u, 0x80000000u}) bits.push_back(e | s);
  std::vector<float> v(bits.size()), out(bits.size());
  std::memcpy(v.data(), bits.data(), bits.size() * 4);
  cpu::round_to_f16(v.data(), out.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    const float want_f = f16_to_f32(f32_to_f16(v[i]));
    uint32_t got, want;
    std::memcpy(&got, &out[i], 4);
    std::memcpy(&want, &want_f, 4);
    ASSERT_EQ(got, want) << std::hex << "input bits 0x" << bits[i];
  }
}

// The 16-bit storage conversions against the scalar ones: narrowing over the same sweep of f32
// patterns, widening over all 65536 16-bit patterns, bit for bit.
TEST(Storage16, NarrowAndWidenMatchTheScalarConversionsBitForBit) {
  std::vector<uint32_t> bits;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 997) bits.push_back(uint32_t(b));
  for (uint32_t e : {0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0x477fe000u, 0x477ff000u, 0x7f800000u,
                     0x7f800001u, 0x7fffffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00000001u})
    for (uint32_t sg : {0u, 0x80000000u}) bits.push_back(e | sg);
  std::vector<float> v(bits.size());
  std::memcpy(v.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> h(v.size());
  cpu::narrow_to_16(true, v.data(), h.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(h[i], f32_to_bf16(v[i]).bits) << std::hex << "bf16 of 0x" << bits[i];
  cpu::narrow_to_16(false, v.data(), h.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(h[i], f32_to_f16(v[i]).bits) << std::hex << "f16 of 0x" << bits[i];
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> w(all.size());
  for (const bool bf16 : {true, false}) {
    cpu::widen_from_16(bf16, all.data(), w.data(), int64_t(all.size()));
    for (uint32_t i = 0; i < 65536; ++i) {
      const float want_f = bf16 ? bf16_to_f32(bf16_t{uint16_t(i)}) : f16_to_f32(f16_t{uint16_t(i)});
      uint32_t got, want;
      std::memcpy(&got, &w[i], 4);
      std::memcpy(&want, &want_f, 4);
      ASSERT_EQ(got, want) << std::hex << (bf16 ? "bf16 0x" : "f16 0x") << i;
    }
  }
}

TEST(LinearF16, ForwardIsTheProductOfFp16RoundedOperands) {
  std::mt19937 g(6);
  const int64_t N = 13, I = 40, O = 21;
  using loom::testing::randn;
  const Tensor x = randn({N, I}, g, 1.0, DType::f32), w = randn({O, I}, g, 0.3, DType::f32);
  std::vector<double> xr(size_t(N * I)), wr(size_t(O * I)), want, mag;
  for (int64_t i = 0; i < N * I; ++i) xr[size_t(i)] = f16_to_f32(f32_to_f16(x.data<float>()[i]));
  for (int64_t i = 0; i < O * I; ++i) wr[size_t(i)] = f16_to_f32(f32_to_f16(w.data<float>()[i]));
  Tensor y = Tensor::empty({N, O}, DType::f32), y32 = Tensor::empty({N, O}, DType::f32);
  ops::linear_forward(x, w, {}, y, ops::ProductPrecision::f16);
  ops::linear_forward(x, w, {}, y32);
  product(xr, wr, N, O, I, true, want, mag);
  expect_products("y", y, want, mag, 1e-5);
  const double moved = max_rel_diff(y, y32, mag);
  EXPECT_GT(moved, 1e-5);
  EXPECT_LT(moved, 2.0 / 2048);  // two fp16 roundings (11 significant bits)
}

TEST(LinearBf16, ForwardAndBackwardAreProductsOfRoundedOperands) {
  std::mt19937 g(2);
  const int64_t N = 37, I = 70, O = 45;
  using loom::testing::randn;
  const Tensor x = randn({N, I}, g, 1.0, DType::f32), w = randn({O, I}, g, 0.3, DType::f32),
               b = randn({O}, g, 1.0, DType::f32), dy = randn({N, O}, g, 1.0, DType::f32);
  const auto xr = rounded_f64(x), wr = rounded_f64(w), dyr = rounded_f64(dy);
  std::vector<double> want, mag;

  Tensor y = Tensor::empty({N, O}, DType::f32), y32 = Tensor::empty({N, O}, DType::f32);
  ops::linear_forward(x, w, b, y, ops::ProductPrecision::bf16);
  ops::linear_forward(x, w, b, y32);
  product(xr, wr, N, O, I, true, want, mag);
  for (int64_t i = 0; i < N * O; ++i) want[size_t(i)] += b.data<float>()[i % O];
  expect_products("y", y, want, mag, 1e-5);
  const double moved = max_rel_diff(y, y32, mag);
  EXPECT_GT(moved, 1e-4) << "bf16 and f32 products agree to " << moved << ": were the operands rounded?";
  EXPECT_LT(moved, 2.0 / 256) << "more than two bf16 roundings apart";

  Tensor dx = Tensor::zeros({N, I}, DType::f32), dw = Tensor::zeros({O, I}, DType::f32),
         db = Tensor::zeros({O}, DType::f32);
  ops::linear_backward(dy, x, w, dx, dw, db, false, ops::ProductPrecision::bf16);
  product(dyr, wr, N, I, O, false, want, mag);
  expect_products("dx", dx, want, mag, 1e-5);
  product(transpose(dyr, N, O), xr, O, I, N, false, want, mag);
  expect_products("dw", dw, want, mag, 1e-5);
  for (int64_t o = 0; o < O; ++o) {  // the bias gradient sums dy itself, not its rounding
    double s = 0, a = 0;
    for (int64_t n = 0; n < N; ++n) s += dy.data<float>()[n * O + o], a += std::fabs(dy.data<float>()[n * O + o]);
    EXPECT_NEAR(db.data<float>()[o], s, 1e-6 * a) << "db " << o;
  }
}

TEST(LinearBf16, HeadAndLossUseRoundedOperands) {
  std::mt19937 g(3);
  const int64_t N = 9, C = 24, V = 50;
  using loom::testing::randn;
  const Tensor x = randn({N, C}, g, 1.0, DType::f32), w = randn({V, C}, g, 0.5, DType::f32);
  std::vector<int32_t> t(N);
  for (int64_t n = 0; n < N; ++n) t[size_t(n)] = int32_t((n * 7) % V);
  t[4] = -1;  // ignored
  const Tensor targets = Tensor::from_vector<int32_t>(t, {N});
  Tensor loss = Tensor::empty({N}, DType::f32), dx = Tensor::empty({N, C}, DType::f32),
         dw = Tensor::zeros({V, C}, DType::f32), work = Tensor::empty({4 * V}, DType::f32);
  ops::lm_head_xent(x, w, targets, loss, dx, dw, 0.5, 4, work, ops::ProductPrecision::bf16);
  const auto xr = rounded_f64(x), wr = rounded_f64(w);
  std::vector<double> logits, mag;
  product(xr, wr, N, V, C, true, logits, mag);
  std::vector<double> dl(size_t(N * V), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (t[size_t(n)] < 0) {
      EXPECT_EQ(loss.data<float>()[n], 0.f);
      continue;
    }
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[size_t(n * V + v)]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[size_t(n * V + v)] - mx);
    const double want = std::log(s) + mx - logits[size_t(n * V + t[size_t(n)])];
    EXPECT_NEAR(loss.data<float>()[n], want, 1e-5 * (1 + std::fabs(want))) << "row " << n;
    for (int64_t v = 0; v < V; ++v)
      dl[size_t(n * V + v)] = 0.5 * (std::exp(logits[size_t(n * V + v)] - mx) / s - (v == t[size_t(n)]));
  }
  // dlogits are rounded to bf16 too, from their f32 values: within one bf16 step of the f64 ones.
  std::vector<double> want;
  product(dl, wr, N, C, V, false, want, mag);
  expect_products("dx", dx, want, mag, 1.0 / 256 + 1e-5);
  product(transpose(dl, N, V), xr, V, C, N, false, want, mag);
  expect_products("dw", dw, want, mag, 1.0 / 256 + 1e-5);
}

TEST(LinearBf16, F64TensorsAreRefused) {
  std::mt19937 g(4);
  const Tensor x = loom::testing::randn({2, 3}, g), w = loom::testing::randn({4, 3}, g);
  Tensor y = Tensor::empty({2, 4}, DType::f64);
  const std::string e = loom::testing::error_of([&] { ops::linear_forward(x, w, {}, y, ops::ProductPrecision::bf16); });
  EXPECT_NE(e.find("[linear] bf16 products need f32 tensors on the CPU, got "), std::string::npos) << e;
}
