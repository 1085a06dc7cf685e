// Whole-model checks: gradients against finite differences in f64 (both families, with and
// without checkpointing, GQA), checkpointing's bitwise-equal gradients and its memory saving.
#include <gtest/gtest.h>

#include <cstring>

#include <random>

#include "loom/model/decoder.h"
#include "testing/gradcheck.h"
#include "testing/random_batch.h"

using namespace loom;
using namespace loom::model;
using loom::testing::random_batch;

namespace {

ModelConfig tiny(Family f) {
  ModelConfig c = preset(f == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = f == Family::gpt2 ? 4 : 2;
  c.d_ff = f == Family::gpt2 ? 64 : 24;
  c.vocab_size = 23;
  c.n_ctx = 16;
  return c;
}

}  // namespace

class ModelGrad : public ::testing::TestWithParam<std::tuple<Family, int>> {};

TEST_P(ModelGrad, MatchesFiniteDifferences) {
  auto [family, ckpt] = GetParam();
  ModelConfig cfg = tiny(family);
  DecoderOptions opt;
  opt.activation_checkpoint_interval = ckpt;
  opt.xent_chunk = 5;
  Decoder m(cfg, opt, DType::f64);
  m.init_weights(1);
  // Perturb norm gains and biases away from 1/0 so their gradients are generic.
  std::mt19937 g(3);
  std::normal_distribution<double> nd(0.0, 0.1);
  for (const auto& p : m.layout().params())
    if (p.init != Init::normal)
      for (int64_t i = 0; i < p.numel(); ++i) m.params().data<double>()[p.offset + i] += nd(g);
  std::vector<int32_t> tok, tgt;
  const int64_t B = 2, T = 7;
  random_batch(B, T, cfg.vocab_size, tok, tgt, 5);
  const double scale = 0.1;
  m.zero_grads();
  int64_t n_valid = 0;
  double loss = m.forward_backward(tok.data(), tgt.data(), B, T, scale, &n_valid);
  EXPECT_EQ(n_valid, B * T - 1);
  EXPECT_NEAR(m.forward(tok.data(), tgt.data(), B, T), loss, 1e-10);
  Tensor grads = m.grads().clone();
  auto f = [&] { return scale * m.forward(tok.data(), tgt.data(), B, T); };
  for (const auto& p : m.layout().params()) {
    Tensor x = m.params().slice(p.offset, {p.numel()});
    Tensor gx = grads.slice(p.offset, {p.numel()});
    loom::testing::expect_grad_close(p.name.c_str(), x, gx, f, 1e-5, 1e-5, 1e-9, 6);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelGrad,
                         ::testing::Values(std::tuple{Family::gpt2, 0}, std::tuple{Family::gpt2, 1},
                                           std::tuple{Family::llama, 0}, std::tuple{Family::llama, 2}));

TEST(Checkpointing, GradientsBitwiseEqualAndActivationsHalved) {
  for (Family fam : {Family::gpt2, Family::llama}) {
    ModelConfig cfg = preset(fam == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
    cfg.n_layer = 4;
    const int64_t B = 2, T = 32;
    std::vector<int32_t> tok, tgt;
    random_batch(B, T, cfg.vocab_size, tok, tgt, 11);
    std::vector<float> ref;
    int64_t bytes_off = 0;
    for (int interval : {0, 1, 2}) {
      CpuAllocator alloc;
      DecoderOptions opt;
      opt.activation_checkpoint_interval = interval;
      Decoder m(cfg, opt, DType::f32, alloc);
      m.init_weights(42);
      alloc.reset_peaks();
      m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T));
      m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T));
      const int64_t act_peak = alloc.snapshot()[MemCategory::activations].peak;
      std::vector<float> g = m.grads().to_f32_vector();
      if (interval == 0) {
        ref = g;
        bytes_off = act_peak;
      } else {
        ASSERT_EQ(g.size(), ref.size());
        EXPECT_EQ(0, std::memcmp(g.data(), ref.data(), g.size() * 4))
            << family_name(fam) << " interval " << interval << ": gradients differ";
        if (interval == 1) {
          EXPECT_LE(act_peak * 2, bytes_off) << family_name(fam) << ": checkpointing every block kept " << act_peak
                                             << " activation bytes vs " << bytes_off << " without";
        }
      }
    }
  }
}
