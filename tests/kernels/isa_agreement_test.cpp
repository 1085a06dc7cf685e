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
template <class A>
double worst(const std::vector<A>& a, const std::vector<double>& b) {
  double w = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    w = std::max(w, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return w / m;
}

// SwiGLU and GELU, forward and backward, on rows whose widths cross the vector widths, with
// inputs from -12 to 12 and the extremes (the sigmoid's divide-free reciprocal and the clamped
// exp): each build within 1e-6 of the f64 reference (libm's exp and a true divide), relative to
// the largest value (GELU's backward 2e-6).
TEST(ActivationIsa, EveryBuildMatchesDoublePrecision) {
  std::mt19937 g(11);
  std::uniform_real_distribution<double> u(-12, 12);
  for (const int64_t F : {1, 15, 16, 17, 33, 1536}) {
    SCOPED_TRACE(F);
    const int64_t N = 3;
    std::vector<double> in(size_t(N * 2 * F)), d(size_t(N * F));
    for (double& x : in) x = double(float(u(g)));
    for (double& x : d) x = double(float(u(g)));
    for (double extreme : {-100.0, 100.0, 0.0, -88.5, 88.5}) in[size_t(g() % in.size())] = extreme;
    std::vector<double> out(d.size()), din(in.size()), gout(in.size()), gdin(in.size());
    loom::cpu::swiglu_forward<double>(in.data(), out.data(), N, F);
    loom::cpu::swiglu_backward<double>(in.data(), d.data(), din.data(), N, F);
    loom::cpu::gelu_forward<double>(in.data(), gout.data(), int64_t(in.size()));
    std::vector<double> dd(in.size());
    for (size_t i = 0; i < dd.size(); ++i) dd[i] = d[i % d.size()];
    loom::cpu::gelu_backward<double>(in.data(), dd.data(), gdin.data(), int64_t(in.size()));
    const std::vector<float> fin(in.begin(), in.end()), fd(d.begin(), d.end()), fdd(dd.begin(), dd.end());
    for (const HotKernels* k : runnable_tables()) {
      SCOPED_TRACE(k->isa);
      std::vector<float> fout(out.size()), fdin(in.size()), fgout(in.size()), fgdin(in.size());
      k->swiglu_forward(fin.data(), fout.data(), N, F);
      k->swiglu_backward(fin.data(), fd.data(), fdin.data(), N, F);
      k->gelu_forward(fin.data(), fgout.data(), int64_t(in.size()));
      k->gelu_backward(fin.data(), fdd.data(), fgdin.data(), int64_t(in.size()));
      EXPECT_LT(worst(fout, out), 1e-6);
      EXPECT_LT(worst(fdin, din), 1e-6);
      EXPECT_LT(worst(fgout, gout), 1e-6);
      EXPECT_LT(worst(fgdin, gdin), 2e-6);  // 1 - t^2 of the f32 tanh: 1.4e-6 measured
    }
  }
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
    k->attention_forward(fqkv.data(), fout.data(), flse.data(), B, T, H, KVH, D, nullptr);
    k->attention_backward(fqkv.data(), fout.data(), fdout.data(), flse.data(), fdqkv.data(), B, T, H, KVH, D, nullptr);
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

// Rows that pack several documents, positions restarting at 0 where each starts: every
// position's output, log-sum-exp and gradient equal those of its document run alone, in f64
// (to rounding) and in every build. The documents cross tile boundaries, start a tile, are one
// token long and fill a whole row.
TEST(AttentionIsa, PackedRowsEqualTheirDocumentsRunApart) {
  const int64_t T = 150, H = 4, KVH = 2, D = 16, W = (H + 2 * KVH) * D;
  const std::vector<std::vector<int64_t>> rows = {{70, 50, 30}, {1, 63, 86}, {150}};
  const int64_t B = int64_t(rows.size());
  std::mt19937 g(12);
  std::normal_distribution<double> n(0, 1.5);
  std::vector<double> qkv(size_t(B * T * W)), dout(size_t(B * T * H * D));
  for (auto& x : qkv) x = n(g);
  for (auto& x : dout) x = n(g);
  std::vector<int32_t> pos(size_t(B * T));
  // Each document alone (B = 1, its own length) gives the expected rows.
  std::vector<double> out(dout.size()), lse(size_t(B * H * T)), dqkv(qkv.size());
  for (int64_t b = 0; b < B; ++b) {
    int64_t t0 = 0;
    for (int64_t len : rows[size_t(b)]) {
      for (int64_t t = 0; t < len; ++t) pos[size_t(b * T + t0 + t)] = int32_t(t);
      const double* q = &qkv[size_t((b * T + t0) * W)];
      const double* dO = &dout[size_t((b * T + t0) * H * D)];
      std::vector<double> o(size_t(len * H * D)), l(size_t(H * len)), dq(size_t(len * W));
      loom::cpu::attention_forward<double>(q, o.data(), l.data(), 1, len, H, KVH, D);
      loom::cpu::attention_backward<double>(q, o.data(), dO, l.data(), dq.data(), 1, len, H, KVH, D);
      std::copy(o.begin(), o.end(), &out[size_t((b * T + t0) * H * D)]);
      std::copy(dq.begin(), dq.end(), &dqkv[size_t((b * T + t0) * W)]);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < len; ++t) lse[size_t((b * H + h) * T + t0 + t)] = l[size_t(h * len + t)];
      t0 += len;
    }
    ASSERT_EQ(t0, T);
  }
  std::vector<double> pout(out.size()), plse(lse.size()), pdqkv(qkv.size());
  loom::cpu::attention_forward<double>(qkv.data(), pout.data(), plse.data(), B, T, H, KVH, D, pos.data());
  loom::cpu::attention_backward<double>(qkv.data(), pout.data(), dout.data(), plse.data(), pdqkv.data(), B, T, H, KVH,
                                        D, pos.data());
  EXPECT_LT(worst(pout, out), 1e-13);
  EXPECT_LT(worst(plse, lse), 1e-13);
  EXPECT_LT(worst(pdqkv, dqkv), 1e-13);
  std::vector<float> fqkv(qkv.begin(), qkv.end()), fdout(dout.begin(), dout.end());
  for (const HotKernels* k : runnable_tables()) {
    SCOPED_TRACE(k->isa);
    std::vector<float> fout(out.size()), flse(lse.size()), fdqkv(qkv.size(), 123.0f);
    k->attention_forward(fqkv.data(), fout.data(), flse.data(), B, T, H, KVH, D, pos.data());
    k->attention_backward(fqkv.data(), fout.data(), fdout.data(), flse.data(), fdqkv.data(), B, T, H, KVH, D,
                          pos.data());
    EXPECT_LT(worst(fout, out), 2e-6);
    EXPECT_LT(worst(flse, lse), 2e-6);
    EXPECT_LT(worst(fdqkv, dqkv), 2e-6);
  }
  // Without the positions the later documents see the earlier ones: the check can fail.
  loom::cpu::attention_forward<double>(qkv.data(), pout.data(), plse.data(), B, T, H, KVH, D);
  EXPECT_GT(worst(pout, out), 1e-3);
}

}  // namespace
