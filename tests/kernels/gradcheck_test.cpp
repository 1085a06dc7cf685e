// Every kernel's backward against central finite differences in f64, on shapes that are not
// multiples of the vector width. Loss = sum(G * f(x)) for a random G.
#include <gtest/gtest.h>

#include "loom/kernels/ops.h"
#include "testing/gradcheck.h"

using namespace loom;
using loom::testing::dot;
using loom::testing::expect_grad_close;
using loom::testing::randn;

namespace {
Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype()); }
}  // namespace

class LinearGrad : public ::testing::TestWithParam<std::tuple<int, int, int, bool>> {};

TEST_P(LinearGrad, MatchesFiniteDifferences) {
  auto [N, I, O, bias] = GetParam();
  std::mt19937 g(1);
  Tensor x = randn({N, I}, g), w = randn({O, I}, g), b = bias ? randn({O}, g) : Tensor{};
  Tensor y = Tensor::empty({N, O}, DType::f64), G = randn({N, O}, g);
  auto loss = [&] {
    ops::linear_forward(x, w, b, y);
    return dot(y, G);
  };
  Tensor dx = zeros_like(x), dw = zeros_like(w), db = bias ? zeros_like(b) : Tensor{};
  ops::linear_backward(G, x, w, dx, dw, db);
  expect_grad_close("dx", x, dx, loss);
  expect_grad_close("dw", w, dw, loss);
  if (bias) expect_grad_close("db", b, db, loss);
}
INSTANTIATE_TEST_SUITE_P(Shapes, LinearGrad,
                         ::testing::Values(std::tuple{3, 5, 7, true}, std::tuple{17, 33, 9, false},
                                           std::tuple{1, 1, 1, true}));

TEST(EmbeddingGrad, MatchesFiniteDifferencesWithRepeatedTokens) {
  std::mt19937 g(2);
  const int N = 11, C = 13, V = 5, P = 11;
  Tensor tok = Tensor::from_vector<int32_t>({0, 3, 3, 1, 4, 0, 0, 2, 3, 1, 4}, {N});
  Tensor pos = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 10}, {N});
  Tensor wte = randn({V, C}, g), wpe = randn({P, C}, g), out = Tensor::empty({N, C}, DType::f64);
  Tensor G = randn({N, C}, g);
  auto loss = [&] {
    ops::embedding_forward(tok, pos, wte, wpe, out);
    return dot(out, G);
  };
  Tensor dwte = zeros_like(wte), dwpe = zeros_like(wpe);
  ops::embedding_backward(tok, pos, G, dwte, dwpe);
  expect_grad_close("dwte", wte, dwte, loss);
  expect_grad_close("dwpe", wpe, dwpe, loss);
}

TEST(LayerNormGrad, MatchesFiniteDifferences) {
  std::mt19937 g(3);
  for (auto [N, C] : {std::pair{5, 7}, std::pair{3, 37}}) {
    Tensor x = randn({N, C}, g, 2.0), w = randn({C}, g), b = randn({C}, g);
    Tensor y = Tensor::empty({N, C}, DType::f64), mean = Tensor::empty({N}, DType::f64),
           rstd = Tensor::empty({N}, DType::f64), G = randn({N, C}, g);
    auto loss = [&] {
      ops::layernorm_forward(x, w, b, y, mean, rstd);
      return dot(y, G);
    };
    loss();
    Tensor dx = zeros_like(x), dw = zeros_like(w), db = zeros_like(b);
    ops::layernorm_backward(G, x, w, mean, rstd, dx, dw, db);
    expect_grad_close("dx", x, dx, loss);
    expect_grad_close("dw", w, dw, loss);
    expect_grad_close("db", b, db, loss);
  }
}

TEST(RmsNormGrad, MatchesFiniteDifferences) {
  std::mt19937 g(4);
  const int N = 6, C = 19;
  Tensor x = randn({N, C}, g), w = randn({C}, g);
  Tensor y = Tensor::empty({N, C}, DType::f64), rstd = Tensor::empty({N}, DType::f64), G = randn({N, C}, g);
  auto loss = [&] {
    ops::rmsnorm_forward(x, w, y, rstd);
    return dot(y, G);
  };
  loss();
  Tensor dx = zeros_like(x), dw = zeros_like(w);
  ops::rmsnorm_backward(G, x, w, rstd, dx, dw);
  expect_grad_close("dx", x, dx, loss);
  expect_grad_close("dw", w, dw, loss);
}

TEST(GeluGrad, MatchesFiniteDifferences) {
  std::mt19937 g(5);
  Tensor x = randn({37}, g, 2.0), y = Tensor::empty({37}, DType::f64), G = randn({37}, g);
  auto loss = [&] {
    ops::gelu_forward(x, y);
    return dot(y, G);
  };
  Tensor dx = zeros_like(x);
  ops::gelu_backward(x, G, dx);
  expect_grad_close("dx", x, dx, loss);
}

TEST(SwigluGrad, MatchesFiniteDifferences) {
  std::mt19937 g(6);
  const int N = 3, F = 11;
  Tensor in = randn({N, 2 * F}, g, 2.0), out = Tensor::empty({N, F}, DType::f64), G = randn({N, F}, g);
  auto loss = [&] {
    ops::swiglu_forward(in, out);
    return dot(out, G);
  };
  Tensor din = zeros_like(in);
  ops::swiglu_backward(in, G, din);
  expect_grad_close("din", in, din, loss);
}

TEST(RopeGrad, InverseIsTransposeAndMatchesFiniteDifferences) {
  std::mt19937 g(7);
  const int N = 5, D = 6, H = 3, W = H * D + 4;
  Tensor x = randn({N, W}, g), G = randn({N, W}, g);
  Tensor pos = Tensor::from_vector<int32_t>({0, 1, 2, 7, 100}, {N});
  auto loss = [&] {
    Tensor y = x.clone();
    ops::rope_apply(y, 2, H, D, pos, 10000.0, false);
    return dot(y, G);
  };
  Tensor dx = G.clone();
  ops::rope_apply(dx, 2, H, D, pos, 10000.0, true);
  expect_grad_close("dx", x, dx, loss);
  Tensor y = x.clone();
  ops::rope_apply(y, 2, H, D, pos, 10000.0, false);
  ops::rope_apply(y, 2, H, D, pos, 10000.0, true);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(y.data<double>()[i], x.data<double>()[i], 1e-12);
}

// Dense reference attention (materialises the T x T scores) for the forward check.
static void dense_attention(const Tensor& qkv, Tensor& out, int64_t H, int64_t KVH) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (H + 2 * KVH);
  const int64_t W = qkv.size(2);
  const double* p = qkv.data<double>();
  double* o = out.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t gk = H + h / (H / KVH), gv = H + KVH + h / (H / KVH);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += p[(b * T + i) * W + h * D + d] * p[(b * T + j) * W + gk * D + d];
          s[size_t(j)] = acc / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += s[size_t(j)] * p[(b * T + j) * W + gv * D + d];
          o[(b * T + i) * H * D + h * D + d] = acc / z;
        }
      }
    }
}

class AttentionGrad : public ::testing::TestWithParam<std::tuple<int, int, int, int, int>> {};

TEST_P(AttentionGrad, MatchesDenseForwardAndFiniteDifferences) {
  auto [B, T, H, KVH, D] = GetParam();
  std::mt19937 g(8);
  const int W = (H + 2 * KVH) * D;
  Tensor qkv = randn({B, T, W}, g), out = Tensor::empty({B, T, H * D}, DType::f64);
  Tensor lse = Tensor::empty({B, H, T}, DType::f64), G = randn({B, T, H * D}, g);
  Tensor ref = Tensor::empty({B, T, H * D}, DType::f64);
  ops::attention_forward(qkv, out, lse, H, KVH);
  dense_attention(qkv, ref, H, KVH);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_NEAR(out.data<double>()[i], ref.data<double>()[i], 1e-12) << i;
  auto loss = [&] {
    ops::attention_forward(qkv, out, lse, H, KVH);
    return dot(out, G);
  };
  loss();
  Tensor dqkv = zeros_like(qkv);
  ops::attention_backward(qkv, out, G, lse, dqkv, H, KVH);
  // The loss sums thousands of terms of size ~1: finite differences carry ~1e-16 |L| / h of
  // rounding, hence the absolute floor.
  expect_grad_close("dqkv", qkv, dqkv, loss, 1e-5, 1e-6, 1e-7, 150);
}
// T beyond one tile (32 query rows / 64 keys) and not a multiple of either; GQA groups.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGrad,
                         ::testing::Values(std::tuple{2, 5, 2, 2, 3}, std::tuple{1, 70, 4, 2, 5},
                                           std::tuple{1, 33, 4, 1, 8}, std::tuple{2, 9, 3, 3, 4},
                                           std::tuple{1, 70, 2, 1, 64}, std::tuple{1, 20, 2, 2, 128}));

TEST(CrossEntropyGrad, ChunkedHeadMatchesFiniteDifferencesAndIgnoresMaskedTargets) {
  std::mt19937 g(9);
  const int N = 7, C = 5, V = 13;
  Tensor x = randn({N, C}, g), w = randn({V, C}, g);
  Tensor tgt = Tensor::from_vector<int32_t>({3, 0, 12, -1, 5, 5, 1}, {N});
  Tensor loss = Tensor::empty({N}, DType::f64), work = Tensor::empty({3 * V}, DType::f64);
  const double scale = 0.37;
  auto f = [&] {
    ops::lm_head_xent(x, w, tgt, loss, {}, {}, 1.0, 3, work);
    double s = 0;
    for (int i = 0; i < N; ++i) s += loss.data<double>()[i];
    return s * scale;
  };
  Tensor dx = zeros_like(x), dw = zeros_like(w);
  ops::lm_head_xent(x, w, tgt, loss, dx, dw, scale, 3, work);
  EXPECT_EQ(loss.data<double>()[3], 0.0);
  expect_grad_close("dx", x, dx, f);
  expect_grad_close("dw", w, dw, f);
  // Same losses whatever the chunk size.
  ops::lm_head_xent(x, w, tgt, loss, {}, {}, 1.0, 3, work);
  std::vector<double> l1(loss.data<double>(), loss.data<double>() + N);
  Tensor big = Tensor::empty({N * V}, DType::f64);
  ops::lm_head_xent(x, w, tgt, loss, {}, {}, 1.0, N, big);
  for (int i = 0; i < N; ++i) EXPECT_NEAR(loss.data<double>()[i], l1[size_t(i)], 1e-12);
}
