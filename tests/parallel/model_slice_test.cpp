// Model slices in one process: a stage's or a tp rank's layout initialises to the whole
// model's values at the same Hugging Face elements; tp slices tile every split parameter; and
// two pipeline stages chained by hand (several micro-batches in flight, with and without
// checkpointing) give the whole model's losses and gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "loom/model/decoder.h"

using namespace loom;
using namespace loom::model;

namespace {
// Value of every (name, global element) in a layout's initialisation.
std::map<std::pair<std::string, int64_t>, float> init_values(const ParamLayout& l, uint64_t seed) {
  std::vector<float> flat(size_t(l.total()));
  init_params(l, seed, flat.data());
  std::map<std::pair<std::string, int64_t>, float> out;
  for (const auto& p : l.params())
    for (const auto& run : l.element_runs(p))
      for (int64_t i = 0; i < run.n; ++i) out[{p.name, run.global + i}] = flat[size_t(p.offset + run.local + i)];
  return out;
}
}  // namespace

TEST(ModelSlice, SlicesInitialiseLikeTheWholeModelAndTpSlicesTileIt) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig cfg = preset(name);
    cfg.vocab_size = 97;  // not a multiple of 2 or 4: the last tp rank holds padding rows
    const auto whole = init_values(ParamLayout(cfg), 5);
    for (int64_t tp : {1, 2, 4}) {
      std::map<std::pair<std::string, int64_t>, int> covered;
      for (int64_t r = 0; r < tp; ++r)
        for (int stage = 0; stage < 2; ++stage) {
          ModelSlice s{stage, stage + 1, stage == 0, stage == 1, tp, r};
          ParamLayout l(cfg, 3, s);
          for (const auto& [key, v] : init_values(l, 5)) {
            ASSERT_TRUE(whole.count(key)) << name << " tp=" << tp << " " << key.first << "[" << key.second << "]";
            EXPECT_EQ(v, whole.at(key)) << key.first;
            const auto& p = l.get(key.first);
            if (!p.tied_copy && !p.tp_replicated) ++covered[key];
          }
        }
      // Every element of a split parameter lives on exactly one tp rank.
      for (const auto& [key, n] : covered) EXPECT_EQ(n, 1) << key.first << " tp=" << tp;
    }
  }
}

TEST(ModelSlice, LastStageHoldsACopyOfTheTiedTableAndKvHeadsReplicateWhenTpDoesNotDivide) {
  const ModelConfig gpt = preset("gpt2-tiny");
  ParamLayout last(gpt, 1, ModelSlice{1, 2, false, true});
  EXPECT_TRUE(last.get("transformer.wte.weight").tied_copy);
  EXPECT_FALSE(last.contains("transformer.wpe.weight"));
  EXPECT_EQ(last.units().front().size(), 0);  // no embedding unit content
  EXPECT_EQ(last.block_unit(1).name, "block.1");
  EXPECT_THROW(last.block_unit(0), Error);
  const ModelConfig llama = preset("llama-tiny");  // 4 heads, 2 kv heads
  ParamLayout split(llama, 1, ModelSlice{0, -1, true, true, 2, 1});
  EXPECT_EQ(split.get("model.layers.0.self_attn.k_proj.weight").shape, (Shape{8, 32}));
  EXPECT_FALSE(split.get("model.layers.0.self_attn.k_proj.weight").tp_grad_partial);
  ParamLayout repl(llama, 1, ModelSlice{0, -1, true, true, 4, 3});
  const auto& k = repl.get("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.shape, (Shape{16, 32}));
  EXPECT_TRUE(k.tp_replicated && k.tp_grad_partial);
  EXPECT_EQ(repl.get("model.embed_tokens.weight").shape, (Shape{25, 32}));  // ceil(97 / 4) rows
  EXPECT_EQ(repl.get("model.layers.0.mlp.down_proj.weight").shape, (Shape{32, 12}));
  try {
    ParamLayout bad(llama, 1, ModelSlice{0, -1, true, true, 3, 0});
    ADD_FAILURE() << "tp=3 should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp=3 does not divide model.n_head=4"), std::string::npos)
        << e.what();
  }
}

class TwoStages : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(TwoStages, ChainedStagesMatchTheWholeModel) {
  const auto [name, ckpt] = GetParam();
  ModelConfig cfg = preset(name);
  cfg.n_layer = 3;
  DecoderOptions o;
  o.activation_checkpoint_interval = ckpt;
  Decoder whole(cfg, o);
  whole.init_weights(11);
  DecoderOptions o0 = o, o1 = o;
  o0.slice = {0, 1, true, false};
  o1.slice = {1, 3, false, true};
  Decoder s0(cfg, o0), s1(cfg, o1);
  s0.init_weights(11);
  s1.init_weights(11);
  const int64_t B = 2, T = 8, M = 3, N = B * T;
  std::vector<std::vector<int32_t>> tok(M, std::vector<int32_t>(size_t(N))), tgt = tok;
  for (int m = 0; m < M; ++m)
    for (int64_t i = 0; i < N; ++i) {
      tok[size_t(m)][size_t(i)] = int32_t((i * 7 + m * 13) % cfg.vocab_size);
      tgt[size_t(m)][size_t(i)] = i % 5 == 4 ? -1 : int32_t((i * 3 + m) % cfg.vocab_size);
    }
  const double scale = 1.0 / double(M * N);
  std::vector<double> ref;
  for (int m = 0; m < M; ++m)
    ref.push_back(whole.forward_backward(tok[size_t(m)].data(), tgt[size_t(m)].data(), B, T, scale));
  // GPipe order on both stages: every forward, then every backward; three slots in flight.
  std::vector<int> id0, id1;
  std::vector<double> got;
  for (int m = 0; m < M; ++m) {
    id0.push_back(s0.stage_begin(B, T, true));
    s0.stage_forward(id0.back(), tok[size_t(m)].data(), tgt[size_t(m)].data(), scale);
    id1.push_back(s1.stage_begin(B, T, true));
    s1.stage_input(id1.back()).copy_from(s0.stage_output(id0.back()));
    got.push_back(s1.stage_forward(id1.back(), tok[size_t(m)].data(), tgt[size_t(m)].data(), scale));
  }
  for (int m = 0; m < M; ++m) {
    s1.stage_backward(id1[size_t(m)], {});
    s0.stage_backward(id0[size_t(m)], s1.stage_input_grad());
  }
  for (int m = 0; m < M; ++m) EXPECT_EQ(got[size_t(m)], ref[size_t(m)]) << "micro-batch " << m;
  // Same operations in the same order: bitwise equal, except the tied table, whose two halves
  // (embedding, head) are summed in another order.
  for (const auto& p : whole.layout().params()) {
    const bool tied = cfg.tied_embeddings && p.name == "transformer.wte.weight";
    std::vector<float> want = whole.grad(p.name).to_f32_vector(), have(want.size(), 0.0f);
    for (Decoder* d : {&s0, &s1})
      if (d->layout().contains(p.name)) {
        auto g = d->grad(p.name).to_f32_vector();
        for (size_t i = 0; i < g.size(); ++i) have[i] += g[i];
      }
    for (size_t i = 0; i < want.size(); ++i) {
      if (tied)
        ASSERT_NEAR(have[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << p.name << "[" << i << "]";
      else
        ASSERT_EQ(have[i], want[i]) << p.name << "[" << i << "]";
    }
  }
  // Two slots' worth of activations at most per in-flight micro-batch: the pool grew to M.
  EXPECT_GT(s0.activation_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, TwoStages,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama-tiny"), ::testing::Values(0, 1, 2)));
