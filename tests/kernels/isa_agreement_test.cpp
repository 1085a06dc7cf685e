// Every instruction-set build of the f32 hot kernels this CPU can run (base, AVX2, AVX-512)
// against the f64 portable build, on shapes that cross tile and vector-width boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "loom/core/cpu_features.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/hot_table.h"

namespace {

using loom::cpu::HotKernels;

std::vector<const HotKernels*> runnable_tables() {
  std::vector<const HotKernels*> t{loom::cpu::hot_kernels_base()};
#if defined(__x86_64__)  // elsewhere the base build is the only one
  if (loom::cpu_features().avx2) t.push_back(loom::cpu::hot_kernels_avx2());
  if (loom::cpu_features().avx512) t.push_back(loom::cpu::hot_kernels_avx512());
#endif
  return t;
}

// Largest |a - b| over the arrays, relative to the largest |b| (f32 rounding of sums scales
// with the magnitude of their terms, not of their result).
double worst(const std::vector<float>& a, const std::vector<double>& b) {
  double w = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    w = std::max(w, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return w / m;
}

class AttentionIsa : public ::testing::TestWithParam<std::tuple<int, int, int, int, int>> {};

TEST_P(AttentionIsa, EveryBuildMatchesDoublePrecision) {
  auto [B, T, H, KVH, D] = GetParam();
  const size_t nqkv = size_t(B * T * (H + 2 * KVH) * D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
  std::mt19937 g(11);
  std::normal_distribution<double> n(0, 1.5);  // scores spread enough for the softmax to be peaked
  std::vector<double> qkv(nqkv), dout(nout), out(nout), lse(nl), dqkv(nqkv);
  for (auto& x : qkv) x = n(g);
  for (auto& x : dout) x = n(g);
  loom::cpu::attention_forward<double>(qkv.data(), out.data(), lse.data(), B, T, H, KVH, D);
  loom::cpu::attention_backward<double>(qkv.data(), out.data(), dout.data(), lse.data(), dqkv.data(), B, T, H, KVH, D);
  std::vector<float> fqkv(qkv.begin(), qkv.end()), fdout(dout.begin(), dout.end());
  for (const HotKernels* k : runnable_tables()) {
    SCOPED_TRACE(k->isa);
    std::vector<float> fout(nout), flse(nl), fdqkv(nqkv, 123.0f);  // stale values must be overwritten
    k->attention_forward(fqkv.data(), fout.data(), flse.data(), B, T, H, KVH, D);
    k->attention_backward(fqkv.data(), fout.data(), fdout.data(), flse.data(), fdqkv.data(), B, T, H, KVH, D);
    EXPECT_LT(worst(fout, out), 2e-6);
    EXPECT_LT(worst(flse, lse), 2e-6);
    EXPECT_LT(worst(fdqkv, dqkv), 2e-6);
  }
}

// One tile is 64 x 64: T below, at, across and well past it, not multiples of 4 or 64; head
// sizes below, at and past one vector chunk (16 floats for AVX-512, 8 for AVX2, 4 for SSE);
// GQA with groups of 1, 2 and 4.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionIsa,
                         ::testing::Values(std::tuple{1, 1, 2, 2, 64}, std::tuple{2, 63, 4, 2, 64},
                                           std::tuple{1, 64, 2, 1, 64}, std::tuple{2, 150, 4, 1, 64},
                                           std::tuple{1, 131, 3, 3, 8}, std::tuple{1, 97, 4, 2, 72},
                                           std::tuple{1, 70, 2, 2, 128}, std::tuple{1, 45, 2, 1, 5}));

}  // namespace
