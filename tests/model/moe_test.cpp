// Mixture-of-Experts blocks: gradients of the whole model against finite differences in f64
// (router, gates, experts, shared experts, both router losses, softmax and sigmoid scores,
// capacity drops, dense and MoE blocks mixed, checkpointing), a one-expert MoE equal to the
// dense model, routing statistics and capacity, the balancing bias, leading dense blocks
// (first_dense), and the config's refusals.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "loom/model/decoder.h"
#include "loom/model/hf_weights.h"
#include "loom/model/memory_estimate.h"
#include "testing/gradcheck.h"
#include "testing/random_batch.h"

using namespace loom;
using namespace loom::model;
using loom::testing::random_batch;

namespace {

ModelConfig tiny_moe(Family f) {
  ModelConfig c = preset(f == Family::gpt2 ? "gpt2-tiny" : "llama-moe-tiny");
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = f == Family::gpt2 ? 4 : 2;
  c.d_ff = f == Family::gpt2 ? 32 : 24;
  c.vocab_size = 23;
  c.n_ctx = 16;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.expert_d_ff = 8;
  return c;
}

struct MoeCase {
  const char* name;
  Family family;
  RouterScore score;
  int64_t top_k, shared, every;
  double capacity, aux, z;
  int ckpt;
};

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

}  // namespace

class MoeGrad : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeGrad, MatchesFiniteDifferences) {
  const MoeCase& c = GetParam();
  ModelConfig cfg = tiny_moe(c.family);
  cfg.moe.score = c.score;
  cfg.moe.top_k = c.top_k;
  cfg.moe.num_shared_experts = c.shared;
  cfg.moe.moe_every = c.every;
  cfg.moe.capacity_factor = c.capacity;
  cfg.moe.router_aux_loss_coef = c.aux;
  cfg.moe.router_z_loss_coef = c.z;
  DecoderOptions opt;
  opt.activation_checkpoint_interval = c.ckpt;
  opt.xent_chunk = 5;
  Decoder m(cfg, opt, DType::f64);
  m.init_weights(1);
  std::mt19937 g(3);
  std::normal_distribution<double> nd(0.0, 0.1);
  for (const auto& p : m.layout().params()) {
    // Norm gains and biases off 1/0; routers larger, so scores differ clearly between experts.
    const bool router = p.name.find("gate.weight") != std::string::npos || p.name.find("router") != std::string::npos;
    if (p.init != Init::normal || router)
      for (int64_t i = 0; i < p.numel(); ++i) m.params().data<double>()[p.offset + i] += router ? 10 * nd(g) : nd(g);
  }
  std::vector<int32_t> tok, tgt;
  const int64_t B = 2, T = 7;
  random_batch(B, T, cfg.vocab_size, tok, tgt, 5);
  const double scale = 0.1;
  m.zero_grads();
  m.reset_moe_stats();
  const double loss = m.forward_backward(tok.data(), tgt.data(), B, T, scale);
  const double router_loss = m.last_router_loss();
  if (c.aux > 0) {
    EXPECT_GT(router_loss, 0.0);
  }
  int64_t dropped = 0;
  for (const auto& st : m.moe_stats()) {
    ASSERT_EQ(st.forwards, 1);
    int64_t routed = 0;
    for (int64_t l : st.load) routed += l;
    EXPECT_EQ(routed, B * T * c.top_k);
    dropped += st.dropped;
  }
  if (c.capacity == 0) {
    EXPECT_EQ(dropped, 0);
  } else {
    EXPECT_GT(dropped, 0) << "the case should exercise dropping";
  }
  auto f = [&] {
    const double ce = m.forward(tok.data(), tgt.data(), B, T);
    return scale * (ce + double(B * T) * m.last_router_loss());
  };
  EXPECT_NEAR(f(), scale * (loss + double(B * T) * router_loss), 1e-10);
  Tensor grads = m.grads().clone();
  for (const auto& p : m.layout().params()) {
    Tensor x = m.params().slice(p.offset, {p.numel()});
    Tensor gx = grads.slice(p.offset, {p.numel()});
    loom::testing::expect_grad_close(p.name.c_str(), x, gx, f, 1e-5, 1e-5, 1e-9, 6);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Routers, MoeGrad,
    ::testing::Values(
        MoeCase{"llama_softmax_top2_shared_aux_z", Family::llama, RouterScore::softmax, 2, 1, 1, 0, 0.1, 0.05, 0},
        MoeCase{"llama_sigmoid_top3_aux_ckpt", Family::llama, RouterScore::sigmoid, 3, 0, 1, 0, 0.1, 0.0, 2},
        MoeCase{"llama_top1_capacity", Family::llama, RouterScore::softmax, 1, 0, 1, 1.0, 0.1, 0.0, 0},
        MoeCase{"gpt2_softmax_every2_capacity_shared", Family::gpt2, RouterScore::softmax, 2, 2, 2, 1.0, 0.05, 0.02, 0},
        MoeCase{"gpt2_sigmoid_top2_ckpt", Family::gpt2, RouterScore::sigmoid, 2, 0, 1, 0, 0.2, 0.01, 1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Moe, OneExpertEqualsTheDenseModel) {
  // With one expert chosen with weight 1, the MoE block is the dense block with the expert's
  // weights: logits match to rounding.
  for (Family f : {Family::llama, Family::gpt2}) {
    ModelConfig dense = tiny_moe(f);
    dense.moe = {};
    ModelConfig moe = tiny_moe(f);
    moe.moe.num_experts = 1;
    moe.moe.top_k = 1;
    moe.moe.expert_d_ff = dense.d_ff;
    Decoder a(dense, {}, DType::f64), b(moe, {}, DType::f64);
    a.init_weights(7);
    b.init_weights(9);
    const bool gpt2 = f == Family::gpt2;
    for (const auto& p : b.layout().params()) {
      std::string n = p.name;
      const auto pos = n.find(gpt2 ? "mlp.experts.0." : "block_sparse_moe.experts.0.");
      if (pos != std::string::npos) {
        n.replace(pos, gpt2 ? 14 : 27, "mlp.");
        if (!gpt2) {
          n.replace(n.find("mlp.") + 4, 2,
                    n.find("w1") != std::string::npos   ? "gate_proj"
                    : n.find("w3") != std::string::npos ? "up_proj"
                                                        : "down_proj");
        }
      }
      if (a.layout().contains(n)) b.param(p.name).copy_from(a.param(n));
    }
    std::vector<int32_t> tok, tgt;
    random_batch(2, 5, dense.vocab_size, tok, tgt, 11);
    Tensor la = Tensor::empty({2 * 5 * dense.vocab_size}, DType::f64), lb = la.clone();
    a.logits(tok.data(), 2, 5, la);
    b.logits(tok.data(), 2, 5, lb);
    for (int64_t i = 0; i < la.numel(); ++i)
      ASSERT_NEAR(la.data<double>()[i], lb.data<double>()[i], 1e-12) << family_name(f) << " logit " << i;
  }
}

namespace {
// A top-1 LLaMA MoE model whose routers are zero: every score is equal and ties go to expert 0,
// so every token picks it.
std::unique_ptr<Decoder> zero_router_model(ModelConfig cfg) {
  cfg.moe.top_k = 1;
  auto m = std::make_unique<Decoder>(cfg, DecoderOptions{}, DType::f32);
  m->init_weights(2);
  for (int l = 0; l < 2; ++l) m->param(str_cat("model.layers.", l, ".block_sparse_moe.gate.weight")).zero();
  return m;
}
constexpr int64_t kB = 2, kT = 8, kN = kB * kT;
// One training step on a fixed batch, with fresh router statistics.
void train_step(Decoder& m) {
  std::vector<int32_t> tok, tgt;
  random_batch(kB, kT, m.config().vocab_size, tok, tgt, 3);
  m.reset_moe_stats();
  m.forward_backward(tok.data(), tgt.data(), kB, kT, 1.0 / double(kN));
}
}  // namespace

TEST(Moe, CapacityDropsAndCountsTokens) {
  ModelConfig cfg = tiny_moe(Family::llama);
  cfg.moe.capacity_factor = 1.0;  // capacity ceil(1.0 * N * 1 / 4) of the N are kept
  auto m = zero_router_model(cfg);
  train_step(*m);
  const int64_t N = kN;
  for (const auto& st : m->moe_stats()) {
    EXPECT_EQ(st.load[0], N);
    EXPECT_EQ(st.dropped, N - (N + 3) / 4);
    EXPECT_NEAR(st.dropped_fraction(), double(N - (N + 3) / 4) / double(N), 1e-12);
    EXPECT_NEAR(st.load_max_over_mean(), 4.0, 1e-12);
    EXPECT_NEAR(st.aux(), 4.0 * 1.0 * 0.25, 1e-6);  // E * f_0 * P_0 = 4 * 1 * 1/4
  }
}

TEST(Moe, BalancingBiasSpreadsTheLoad) {
  ModelConfig cfg = tiny_moe(Family::llama);
  cfg.moe.bias_update_rate = 0.01;
  auto m = zero_router_model(cfg);
  train_step(*m);
  EXPECT_EQ(m->moe_stats()[0].load[0], kN);  // ties: everything on expert 0
  m->update_router_bias(m->moe_stats(), 0.01);
  const float* b = m->router_bias().data<float>();
  EXPECT_FLOAT_EQ(b[0], -0.01f);
  EXPECT_FLOAT_EQ(b[1], 0.01f);
  train_step(*m);
  EXPECT_EQ(m->moe_stats()[0].load[0], 0) << "the overloaded expert's bias now ranks it last";
}

TEST(Moe, ConfigRefusals) {
  auto refuses = [](auto edit, const char* needle) {
    ModelConfig c = tiny_moe(Family::llama);
    edit(c);
    try {
      c.validate();
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refuses([](ModelConfig& c) { c.moe.top_k = 5; }, "model.moe.top_k=5");
  refuses([](ModelConfig& c) { c.moe.moe_every = 3; }, "model.moe.moe_every=3");
  refuses([](ModelConfig& c) { c.moe.first_dense = 2; }, "model.moe.first_dense=2");
  refuses(
      [](ModelConfig& c) {
        c.moe.first_dense = 1;
        c.moe.moe_every = 2;
      },
      "model.moe.moe_every=2");
  refuses([](ModelConfig& c) { c.moe.num_experts = -1; }, "model.moe.num_experts");
  refuses([](ModelConfig& c) { c.moe.capacity_factor = 0.1; }, "model.moe.capacity_factor");
}

TEST(Moe, PresetsHaveTheDenseModelsActiveParameters) {
  const ModelConfig dense = preset("llama-60m"), moe = preset("llama-moe-60m");
  EXPECT_EQ(moe.moe.top_k * moe.expert_d_ff(), dense.d_ff);
  ParamLayout ld(dense), lm(moe);
  const int64_t expert = 3 * moe.d_model * moe.expert_d_ff();
  const int64_t router = moe.moe.num_experts * moe.d_model;
  // Active: everything but the E - k experts a token skips, less the router.
  EXPECT_EQ(lm.num_params() - moe.n_layer * ((moe.moe.num_experts - moe.moe.top_k) * expert + router), ld.num_params());
  EXPECT_TRUE(lm.contains("model.layers.3.block_sparse_moe.experts.7.w2.weight"));
  EXPECT_TRUE(lm.contains("model.layers.0.block_sparse_moe.gate.weight"));
}

TEST(Moe, FirstDenseBlocksPrecedeTheMoeBlocks) {
  ModelConfig cfg = preset("llama-moe-60m");
  cfg.moe.first_dense = 1;
  cfg.moe.moe_every = 2;
  cfg.validate();
  std::vector<int> moe_layers;
  for (int l = 0; l < cfg.n_layer; ++l)
    if (cfg.is_moe_layer(l)) moe_layers.push_back(l);
  EXPECT_EQ(moe_layers, (std::vector<int>{2, 4, 6}));
  ASSERT_EQ(cfg.num_moe_layers(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cfg.moe_layer(i), moe_layers[size_t(i)]);
    EXPECT_EQ(cfg.moe_index(moe_layers[size_t(i)]), i);
  }
  EXPECT_EQ(cfg.dense_mlp_width(cfg.d_ff), cfg.d_ff);
  const ParamLayout layout(cfg);
  EXPECT_TRUE(layout.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(layout.contains("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_TRUE(layout.contains("model.layers.2.block_sparse_moe.experts.7.w2.weight"));
  // config.json carries it, so an exported checkpoint builds the same blocks.
  const ModelConfig back = parse_hf_config(hf_config_json(cfg), "test");
  EXPECT_EQ(back.moe.first_dense, 1);
  EXPECT_EQ(back.moe.moe_every, 2);
  // Every block but the first MoE: 1 dense block, 7 MoE ones.
  cfg.moe.moe_every = 1;
  EXPECT_EQ(cfg.num_moe_layers(), 7);
  EXPECT_FALSE(cfg.is_moe_layer(0));
  EXPECT_TRUE(cfg.is_moe_layer(1));
  EXPECT_EQ(cfg.moe_layer(0), 1);
}

TEST(Moe, MemoryEstimateMatchesTheDecodersBuffers) {
  // The closed form (model/memory_estimate) against the buffers the decoder holds, for dense,
  // all-MoE and mixed models with shared experts, with and without checkpointing.
  for (int variant = 0; variant < 5; ++variant) {
    ModelConfig cfg = tiny_moe(Family::llama);
    if (variant == 0) cfg.moe = {};
    if (variant >= 2) cfg.moe.num_shared_experts = 2;
    if (variant == 3) cfg.moe.moe_every = 2;
    if (variant == 4) cfg.moe.first_dense = 1;
    for (int ckpt : {0, 1}) {
      DecoderOptions opt;
      opt.activation_checkpoint_interval = ckpt;
      Decoder m(cfg, opt);
      m.init_weights(1);
      std::vector<int32_t> tok, tgt;
      const int64_t B = 2, T = 8;
      random_batch(B, T, cfg.vocab_size, tok, tgt, 3);
      m.forward_backward(tok.data(), tgt.data(), B, T, 1.0);
      const auto est = estimate_training_memory(cfg, m.num_params(), B, T, ckpt, opt.xent_chunk);
      EXPECT_EQ(m.activation_bytes(), est.activations) << "variant " << variant << " ckpt " << ckpt;
    }
  }
}

TEST(Moe, TrainingFlopsCountActiveExpertsOnly) {
  const ModelConfig dense = preset("llama-60m"), moe = preset("llama-moe-60m");
  const double fd = training_flops(dense, ParamLayout(dense).num_params(), 1, 256);
  const double fm = training_flops(moe, ParamLayout(moe).num_params(), 1, 256);
  // Same active parameters plus the router's 8 x 512 per block.
  EXPECT_NEAR(fm - fd, 6.0 * 256 * 8 * 8 * 512, 1.0);
}
