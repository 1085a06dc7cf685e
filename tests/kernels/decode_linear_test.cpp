// decode_linear (the few-row, weight-streaming linear used while decoding) against the BLAS
// linear, over odd shapes, with and without bias, and row independence of the batch size.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "loom/core/error.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/decode_linear.h"
#include "loom/kernels/ops.h"

using namespace loom;

// Every instruction-set build this CPU runs.
class DecodeLinearIsa : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeLinearIsa, MatchesBlasLinear) {
  const std::string isa = GetParam();
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t I : {5, 8, 16, 37, 96}) {
    for (int64_t O : {1, 7, 130}) {
      for (int64_t M = 1; M <= cpu::kDecodeLinearMaxRows; ++M) {
        for (bool bias : {false, true}) {
          std::vector<float> x(static_cast<size_t>(M * I)), w(static_cast<size_t>(O * I)), b(static_cast<size_t>(O));
          for (auto* v : {&x, &w, &b})
            for (auto& e : *v) e = nd(g);
          std::vector<float> got(static_cast<size_t>(M * O), -1.f);
          cpu::decode_linear_on(isa, x.data(), w.data(), bias ? b.data() : nullptr, got.data(), M, I, O);
          Tensor y = Tensor::zeros({M, O}, DType::f32);
          ops::linear_forward(Tensor::from_vector(x, {M, I}), Tensor::from_vector(w, {O, I}),
                              bias ? Tensor::from_vector(b, {O}) : Tensor{}, y);
          for (int64_t k = 0; k < M * O; ++k)
            ASSERT_NEAR(got[size_t(k)], y.data<float>()[k], 1e-4 * std::sqrt(double(I)))
                << "I=" << I << " O=" << O << " M=" << M << " bias=" << bias;
        }
      }
    }
  }
}

TEST_P(DecodeLinearIsa, ARowsResultDoesNotDependOnTheRowCount) {
  const std::string isa = GetParam();
  const int64_t I = 50, O = 33, M = cpu::kDecodeLinearMaxRows;
  std::mt19937 g(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(M * I)), w(static_cast<size_t>(O * I)), all(static_cast<size_t>(M * O)),
      one(static_cast<size_t>(O));
  for (auto& e : x) e = nd(g);
  for (auto& e : w) e = nd(g);
  cpu::decode_linear_on(isa, x.data(), w.data(), nullptr, all.data(), M, I, O);
  for (int64_t m = 0; m < M; ++m) {
    cpu::decode_linear_on(isa, x.data() + m * I, w.data(), nullptr, one.data(), 1, I, O);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + m * O)) << "row " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Runnable, DecodeLinearIsa, ::testing::ValuesIn(cpu::isas_here()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(DecodeLinear, RefusesAnInstructionSetThisCpuLacks) {
  float x = 1, w = 1, y = 0;
  EXPECT_THROW(cpu::decode_linear_on("sse9", &x, &w, nullptr, &y, 1, 1, 1), Error);
}
