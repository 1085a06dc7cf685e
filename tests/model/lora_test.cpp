// LoRA at the model level: the adapter layout, an adapted model equal to its merged weights
// (W + scale B A), adapter gradients against finite differences in f64, no gradient and no
// change for the frozen weights, and the configuration's refusals.
#include <gtest/gtest.h>

#include <random>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/model/decoder.h"
#include "testing/gradcheck.h"
#include "testing/random_batch.h"
#include "testing/tiny_models.h"

using namespace loom;
using namespace loom::model;
using loom::testing::random_batch;

namespace {

ModelConfig tiny_lora(std::vector<LoraTarget> targets) {
  ModelConfig c = loom::testing::tiny_llama();
  c.lora.rank = 3;
  c.lora.alpha = 6;
  c.lora.targets = std::move(targets);
  return c;
}

const std::vector<LoraTarget> kAll = {LoraTarget::q,    LoraTarget::k,  LoraTarget::v,   LoraTarget::o,
                                      LoraTarget::gate, LoraTarget::up, LoraTarget::down};

DecoderOptions adapters(DecoderOptions o = {}) {
  o.slice.lora_adapters = true;
  return o;
}

template <class T>
void fill_normal(const Tensor& t, double std, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> nd(0.0, std);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(nd(g));
}

// The merged model: each adapted projection's rows W + scale B A, in a model without adapters.
template <class T>
void merge_into(const Decoder& lora, Decoder& plain) {
  const ModelConfig& cfg = lora.config();
  plain.params().copy_from(lora.base_params());
  for (int l = 0; l < cfg.n_layer; ++l)
    for (const LoraSpec& s : lora_specs(cfg)) {
      const std::string n = lora.layout().block_prefix(l) + s.proj;
      const Tensor a = lora.param(n + ".lora_A.weight"), b = lora.param(n + ".lora_B.weight");
      Tensor w = plain.param(n + ".weight");
      const int64_t r = cfg.lora.rank;
      for (int64_t o = 0; o < s.out; ++o)
        for (int64_t i = 0; i < s.in; ++i) {
          double acc = 0;
          for (int64_t k = 0; k < r; ++k) acc += double(b.data<T>()[o * r + k]) * double(a.data<T>()[k * s.in + i]);
          w.data<T>()[o * s.in + i] += T(cfg.lora.scale() * acc);
        }
    }
}

}  // namespace

TEST(LoraLayout, HoldsTheAdaptersOfEveryBlockUnderPeftNames) {
  const ModelConfig cfg = tiny_lora({LoraTarget::q, LoraTarget::v, LoraTarget::down});
  ModelSlice slice;
  slice.lora_adapters = true;
  const ParamLayout layout(cfg, 4, slice);
  ASSERT_EQ(layout.units().size(), 4u);  // embed, block.0, block.1, head
  EXPECT_EQ(layout.units()[0].size(), 0);
  EXPECT_EQ(layout.units()[3].size(), 0);
  const int64_t r = 3, C = 16, KV = 2 * 4, F = 24;
  EXPECT_EQ(layout.get("model.layers.1.self_attn.q_proj.lora_A.weight").shape, (Shape{r, C}));
  EXPECT_EQ(layout.get("model.layers.1.self_attn.q_proj.lora_B.weight").shape, (Shape{C, r}));
  EXPECT_EQ(layout.get("model.layers.0.self_attn.v_proj.lora_B.weight").shape, (Shape{KV, r}));
  EXPECT_EQ(layout.get("model.layers.0.mlp.down_proj.lora_A.weight").shape, (Shape{r, F}));
  EXPECT_FALSE(layout.contains("model.layers.0.self_attn.k_proj.lora_A.weight"));
  EXPECT_FALSE(layout.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(layout.num_params(), 2 * (r * C + C * r + r * C + KV * r + r * F + C * r));
  for (const ParamInfo& p : layout.params()) {
    EXPECT_EQ(p.init, p.name.find("lora_B") != std::string::npos ? Init::zeros : Init::normal) << p.name;
    EXPECT_FALSE(p.weight_decay) << p.name;
  }
  // Tensor parallel: column-parallel targets split B's rows, row-parallel ones A's columns; the
  // other matrix is replicated with its gradient summed over the tp group.
  slice.tp = 2;
  const ParamLayout half(cfg, 1, slice);
  const ParamInfo& qa = half.get("model.layers.0.self_attn.q_proj.lora_A.weight");
  const ParamInfo& qb = half.get("model.layers.0.self_attn.q_proj.lora_B.weight");
  const ParamInfo& da = half.get("model.layers.0.mlp.down_proj.lora_A.weight");
  const ParamInfo& db = half.get("model.layers.0.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(qa.shape, (Shape{r, C}));
  EXPECT_TRUE(qa.tp_replicated && qa.tp_grad_partial);
  EXPECT_EQ(qb.shape, (Shape{C / 2, r}));
  EXPECT_EQ(qb.split_dim, 0);
  EXPECT_EQ(da.shape, (Shape{r, F / 2}));
  EXPECT_EQ(da.split_dim, 1);
  EXPECT_TRUE(db.tp_replicated && db.tp_grad_partial);
}

TEST(LoraModel, StartsAsTheModelAndEqualsItsMergedWeights) {
  const ModelConfig cfg = tiny_lora(kAll);
  ModelConfig plain_cfg = cfg;
  plain_cfg.lora = {};
  Decoder lora(cfg, adapters(), DType::f64), plain(plain_cfg, {}, DType::f64);
  lora.init_base_weights(7);
  lora.init_weights(8);
  const int64_t B = 2, T = 9;
  std::vector<int32_t> tok, tgt;
  random_batch(B, T, cfg.vocab_size, tok, tgt, 3);
  // B = 0 at initialisation: the adapted model is the model.
  plain.params().copy_from(lora.base_params());
  const double base_loss = plain.forward(tok.data(), tgt.data(), B, T);
  EXPECT_DOUBLE_EQ(lora.forward(tok.data(), tgt.data(), B, T), base_loss);
  // Trained adapters (B nonzero): the model with W + scale B A in every adapted projection.
  for (const ParamInfo& p : lora.layout().params())
    if (p.init == Init::zeros) fill_normal<double>(lora.params().slice(p.offset, {p.numel()}), 0.3, 11);
  const double adapted = lora.forward(tok.data(), tgt.data(), B, T);
  merge_into<double>(lora, plain);
  EXPECT_NEAR(adapted, plain.forward(tok.data(), tgt.data(), B, T), 1e-12);
  EXPECT_GT(std::abs(adapted - base_loss), 1e-3);  // the adapters changed the model
  Tensor la = Tensor::empty({B, T, cfg.vocab_size}, DType::f64), pa = Tensor::empty({B, T, cfg.vocab_size}, DType::f64);
  lora.logits(tok.data(), B, T, la);
  plain.logits(tok.data(), B, T, pa);
  for (int64_t i = 0; i < la.numel(); ++i) ASSERT_NEAR(la.data<double>()[i], pa.data<double>()[i], 1e-12) << i;
}

class LoraGrad : public ::testing::TestWithParam<int> {};

TEST_P(LoraGrad, AdapterGradientsMatchFiniteDifferencesAndTheModelStaysFrozen) {
  const ModelConfig cfg = tiny_lora(kAll);
  DecoderOptions opt = adapters();
  opt.activation_checkpoint_interval = GetParam();
  opt.xent_chunk = 5;
  Decoder m(cfg, opt, DType::f64);
  m.init_base_weights(1);
  m.init_weights(2);
  for (const ParamInfo& p : m.layout().params())  // B away from 0, so that A's gradient is generic
    if (p.init == Init::zeros) fill_normal<double>(m.params().slice(p.offset, {p.numel()}), 0.2, 5);
  // The gradient buffer holds the adapters only.
  EXPECT_EQ(m.grads().numel(), m.layout().total());
  EXPECT_LT(m.layout().total(), m.base_layout().total());
  const Tensor base_before = m.base_params().clone();
  std::vector<int32_t> tok, tgt;
  const int64_t B = 2, T = 7;
  random_batch(B, T, cfg.vocab_size, tok, tgt, 5);
  const double scale = 0.1;
  m.zero_grads();
  const double loss = m.forward_backward(tok.data(), tgt.data(), B, T, scale);
  EXPECT_NEAR(m.forward(tok.data(), tgt.data(), B, T), loss, 1e-10);
  const Tensor grads = m.grads().clone();
  auto f = [&] { return scale * m.forward(tok.data(), tgt.data(), B, T); };
  for (const ParamInfo& p : m.layout().params()) {
    Tensor x = m.params().slice(p.offset, {p.numel()});
    Tensor gx = grads.slice(p.offset, {p.numel()});
    loom::testing::expect_grad_close(p.name.c_str(), x, gx, f, 1e-5, 1e-5, 1e-9, 6);
  }
  for (int64_t i = 0; i < base_before.numel(); ++i)
    ASSERT_EQ(m.base_params().data<double>()[i], base_before.data<double>()[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, LoraGrad, ::testing::Values(0, 1));

TEST(LoraConfig, RefusesWhatItCannotAdaptNamingTheKey) {
  auto refused = [](ModelConfig c, const std::string& words) {
    try {
      c.validate();
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  ModelConfig c = tiny_lora({LoraTarget::q});
  c.lora.rank = -1;
  refused(c, "model.lora.rank must be positive");
  c = tiny_lora({LoraTarget::q});
  c.lora.rank = 9;  // above the k/v width 8
  refused(c, "model.lora.rank=9 is not low");
  c = tiny_lora({LoraTarget::q, LoraTarget::q});
  refused(c, "names q twice");
  c = tiny_lora({});
  refused(c, "model.lora.targets is empty");
  c = tiny_lora({LoraTarget::q});
  c.lora.dropout = 1;
  refused(c, "model.lora.dropout=1 must be in [0, 1)");
  ModelConfig g = preset("gpt2-tiny");
  g.lora.rank = 4;
  refused(g, "model.lora needs a LLaMA-family model");
  ModelConfig moe = preset("llama-moe-tiny");
  moe.lora.rank = 4;
  moe.lora.targets = {LoraTarget::q, LoraTarget::o};
  refused(moe, "model.lora on a Mixture-of-Experts model (llama-moe-tiny) is not built yet");
}

TEST(LoraModel, Bf16BaseIsTheF32BaseRoundedAtHalfTheBytes) {
  ModelConfig cfg = tiny_lora(kAll);
  ModelConfig cfg16 = cfg;
  cfg16.lora.base_dtype = DType::bf16;
  Decoder ref(cfg, adapters()), half(cfg16, adapters());
  ASSERT_EQ(half.base_params().dtype(), DType::bf16);
  Tensor w = Tensor::empty({ref.base_layout().total()}, DType::f32);
  init_params(ref.base_layout(), 3, w.data<float>());
  // The reference holds the bf16-rounded weights in f32.
  Tensor rounded16 = Tensor::empty({w.numel()}, DType::bf16), rounded = Tensor::empty({w.numel()}, DType::f32);
  ops::narrow_to_16(w, rounded16);
  ops::widen_from_16(rounded16, rounded);
  ref.set_base_params(rounded);
  half.set_base_params(w);
  ref.init_weights(4);
  for (const ParamInfo& p : ref.layout().params())
    if (p.init == Init::zeros) fill_normal<float>(ref.params().slice(p.offset, {p.numel()}), 0.2f, 6);
  half.params().copy_from(ref.params());
  std::vector<int32_t> tok, tgt;
  const int64_t B = 2, T = 9;
  random_batch(B, T, cfg.vocab_size, tok, tgt, 8);
  ref.zero_grads();
  half.zero_grads();
  EXPECT_EQ(ref.forward_backward(tok.data(), tgt.data(), B, T, 0.1),
            half.forward_backward(tok.data(), tgt.data(), B, T, 0.1));
  for (int64_t i = 0; i < ref.grads().numel(); ++i)
    ASSERT_EQ(ref.grads().data<float>()[i], half.grads().data<float>()[i]) << i;
  // Blocks in bf16; the embeddings, final norm and head kept in f32.
  int64_t outer = 0;
  for (const ParamInfo& p : ref.base_layout().params())
    if (p.layer < 0) outer += p.numel();
  EXPECT_EQ(half.frozen_bytes(), 2 * ref.base_layout().total() + 4 * outer);
  EXPECT_EQ(ref.frozen_bytes(), 4 * ref.base_layout().total());
}

class LoraDropoutGrad : public ::testing::TestWithParam<int> {};

// Dropout on the adapters' input: a training pass with a given (seed, step) draws the same masks
// again (so forward, recomputation and backward agree and the gradient is that of the masked
// loss), another step draws others, and evaluation drops nothing.
TEST_P(LoraDropoutGrad, MasksAreKeyedAndGradientsMatchTheMaskedLoss) {
  ModelConfig cfg = tiny_lora(kAll);
  cfg.lora.dropout = 0.3;
  DecoderOptions opt = adapters();
  opt.activation_checkpoint_interval = GetParam();
  Decoder m(cfg, opt, DType::f64);
  m.init_base_weights(1);
  m.init_weights(2);
  for (const ParamInfo& p : m.layout().params())
    if (p.init == Init::zeros) fill_normal<double>(m.params().slice(p.offset, {p.numel()}), 0.2, 5);
  std::vector<int32_t> tok, tgt;
  const int64_t B = 2, T = 7;
  random_batch(B, T, cfg.vocab_size, tok, tgt, 5);
  const double scale = 0.1;
  auto train_loss = [&](int64_t step) {
    m.set_dropout_step(9, step);
    return m.forward_backward(tok.data(), tgt.data(), B, T, scale);
  };
  m.zero_grads();
  const double loss = train_loss(3);
  const Tensor grads = m.grads().clone();
  EXPECT_EQ(train_loss(3), loss);
  EXPECT_NE(train_loss(4), loss);
  const double eval = m.forward(tok.data(), tgt.data(), B, T);
  EXPECT_NE(eval, loss);
  cfg.lora.dropout = 0;
  Decoder plain(cfg, adapters(), DType::f64);
  plain.set_base_params([&] {
    Tensor f = Tensor::empty({m.base_layout().total()}, DType::f32);
    init_params(m.base_layout(), 1, f.data<float>());
    return f;
  }());
  plain.params().copy_from(m.params());
  EXPECT_EQ(plain.forward(tok.data(), tgt.data(), B, T), eval);
  auto f = [&] { return scale * train_loss(3); };
  for (const ParamInfo& p : m.layout().params()) {
    Tensor x = m.params().slice(p.offset, {p.numel()});
    Tensor gx = grads.slice(p.offset, {p.numel()});
    loom::testing::expect_grad_close(p.name.c_str(), x, gx, f, 1e-5, 1e-5, 1e-9, 6);
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, LoraDropoutGrad, ::testing::Values(0, 1));
