// Model slices in one process: a stage's or a tp rank's layout initialises to the whole
// model's values at the same Hugging Face elements; tp slices tile every split parameter; and
// two pipeline stages chained by hand (several micro-batches in flight, with and without
// checkpointing) give the whole model's losses and gradients, and so do two interleaved stages
// of two chunks each run in the interleaved 1F1B order; a backward split into its input- and
// weight-gradient passes (zero-bubble schedules) gives the gradients of the whole backward.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "loom/model/decoder.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/pipeline_schedule.h"

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

TEST(ModelSlice, InterleavedChunksHoldTheirBlocksInModelOrder) {
  const ModelConfig cfg = [] {
    ModelConfig c = preset("gpt2-tiny");
    c.n_layer = 4;
    return c;
  }();
  ModelSlice s{1, 2, false, true};
  s.later_chunks = {{3, 4}};
  ParamLayout l(cfg, 1, s);
  EXPECT_EQ(l.layers(), (std::vector<int>{1, 3}));
  EXPECT_EQ(l.chunks(), (std::vector<LayerRange>{{1, 2}, {3, 4}}));
  EXPECT_TRUE(l.has_block(3));
  EXPECT_FALSE(l.has_block(2));
  EXPECT_EQ(l.local_index(3), 1);
  EXPECT_EQ(l.block_unit(3).name, "block.3");
  EXPECT_FALSE(l.whole_model());
  try {
    l.block_unit(2);
    ADD_FAILURE() << "block 2 is not in the slice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(blocks 1..1, 3..3)"), std::string::npos) << e.what();
  }
  s.later_chunks = {{0, 1}};  // before the first chunk
  EXPECT_THROW(ParamLayout(cfg, 1, s), Error);
  s.later_chunks = {{2, 4}};  // a chunk of two blocks beside one of one: slots could not be shared
  EXPECT_NO_THROW(ParamLayout(cfg, 1, s));
  EXPECT_THROW(Decoder(cfg, DecoderOptions{.slice = s}), Error);
}

class InterleavedStages : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

// Model chunks 0 and 2 on stage 0, 1 and 3 on stage 1 (one block each), driven in the
// interleaved 1F1B order of pipeline_schedule.h by a replay that runs each action once its
// input exists: losses and gradients are the whole model's, bitwise but for the tied table.
TEST(ModelSlice, AStageSliceHoldsTheChunksItsPlacementGivesIt) {
  using parallel::ChunkPlacement;
  using parallel::stage_slice;
  const auto chunks = parallel::partition_uniform(8, 4);  // [0,2) [2,4) [4,6) [6,8)
  // Interleaved (loop), 2 stages of 2 chunks: stage 0 holds model chunks 0 and 2, stage 1 1 and 3.
  ModelSlice s = stage_slice(chunks, 1, 2, 2, ChunkPlacement::loop);
  EXPECT_EQ(std::make_pair(s.first_layer, s.last_layer), std::make_pair(2, 4));
  ASSERT_EQ(s.later_chunks.size(), 1u);
  EXPECT_EQ(std::make_pair(s.later_chunks[0].first, s.later_chunks[0].last), std::make_pair(6, 8));
  EXPECT_FALSE(s.has_embedding);
  EXPECT_TRUE(s.has_head);
  // ZB-V: stage 0 holds chunks 0 and 3, so both ends; stage 1 chunks 1 and 2, neither.
  s = stage_slice(chunks, 0, 2, 2, ChunkPlacement::vee);
  EXPECT_EQ(std::make_pair(s.first_layer, s.last_layer), std::make_pair(0, 2));
  ASSERT_EQ(s.later_chunks.size(), 1u);
  EXPECT_EQ(std::make_pair(s.later_chunks[0].first, s.later_chunks[0].last), std::make_pair(6, 8));
  EXPECT_TRUE(s.has_embedding && s.has_head);
  s = stage_slice(chunks, 1, 2, 2, ChunkPlacement::vee);
  EXPECT_EQ(std::make_pair(s.first_layer, s.later_chunks.at(0).first), std::make_pair(2, 4));
  EXPECT_FALSE(s.has_embedding || s.has_head);
  // One chunk per stage: the plain pipeline's ends.
  s = stage_slice(parallel::partition_uniform(8, 2), 0, 2, 1, ChunkPlacement::loop);
  EXPECT_TRUE(s.has_embedding && !s.has_head && s.later_chunks.empty());
  EXPECT_THROW(stage_slice(chunks, 0, 2, 1, ChunkPlacement::loop), Error);  // 4 ranges for 2 chunks
}

TEST_P(InterleavedStages, RingOfChunksMatchesTheWholeModel) {
  const auto [name, ckpt] = GetParam();
  ModelConfig cfg = preset(name);
  cfg.n_layer = 4;
  DecoderOptions o;
  o.activation_checkpoint_interval = ckpt;
  Decoder whole(cfg, o);
  whole.init_weights(11);
  const int p = 2, v = 2, M = 4;
  std::vector<std::unique_ptr<Decoder>> stage;
  for (int s = 0; s < p; ++s) {
    DecoderOptions os = o;
    os.slice = {s, s + 1, s == 0, s == p - 1};
    os.slice.later_chunks = {{p + s, p + s + 1}};
    stage.push_back(std::make_unique<Decoder>(cfg, os));
    stage.back()->init_weights(11);
    ASSERT_EQ(stage.back()->num_chunks(), v);
  }
  const int64_t B = 2, T = 8, N = B * T;
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
  // What each (stage, chunk, micro-batch) produced: its output, and its input's gradient.
  using Key = std::tuple<int, int, int>;
  std::map<Key, std::vector<float>> out, din;
  std::map<Key, int> slot;
  std::vector<double> got(size_t(M), 0.0);
  const auto sched = parallel::interleaved_schedule(p, M, v);
  std::vector<size_t> next(size_t(p), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < p; ++s)
      for (; next[size_t(s)] < sched[size_t(s)].size(); ++next[size_t(s)]) {
        const auto& a = sched[size_t(s)][next[size_t(s)]];
        Decoder& d = *stage[size_t(s)];
        const int c = a.chunk, m = a.micro;
        if (a.kind == parallel::PipeAction::Kind::forward) {
          const bool embeds = s == 0 && c == 0;
          const Key from = s > 0 ? Key{s - 1, c, m} : Key{p - 1, c - 1, m};
          if (!embeds && !out.count(from)) break;
          const int id = slot[{s, c, m}] = d.stage_begin(B, T, true, c);
          if (!embeds) d.stage_input(id).copy_from(Tensor::from_vector<float>(out[from], {N, cfg.d_model}));
          got[size_t(m)] += d.stage_forward(id, tok[size_t(m)].data(), tgt[size_t(m)].data(), scale);
          out[{s, c, m}] = d.stage_output(id).to_f32_vector();
        } else {
          const bool heads = s == p - 1 && c == v - 1;
          const Key from = s + 1 < p ? Key{s + 1, c, m} : Key{0, c + 1, m};
          if (!heads && !din.count(from)) break;
          const int id = slot.at({s, c, m});
          d.stage_backward(id, heads ? Tensor{} : Tensor::from_vector<float>(din[from], {N, cfg.d_model}));
          din[{s, c, m}] = d.stage_input_grad().to_f32_vector();
        }
        progressed = true;
      }
  }
  for (int s = 0; s < p; ++s) ASSERT_EQ(next[size_t(s)], sched[size_t(s)].size()) << "stage " << s << " stalled";
  for (int m = 0; m < M; ++m) EXPECT_EQ(got[size_t(m)], ref[size_t(m)]) << "micro-batch " << m;
  for (const auto& pi : whole.layout().params()) {
    const bool tied = cfg.tied_embeddings && pi.name == "transformer.wte.weight";
    std::vector<float> want = whole.grad(pi.name).to_f32_vector(), have(want.size(), 0.0f);
    for (const auto& d : stage)
      if (d->layout().contains(pi.name)) {
        auto g = d->grad(pi.name).to_f32_vector();
        for (size_t i = 0; i < g.size(); ++i) have[i] += g[i];
      }
    for (size_t i = 0; i < want.size(); ++i) {
      if (tied)
        ASSERT_NEAR(have[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << pi.name << "[" << i << "]";
      else
        ASSERT_EQ(have[i], want[i]) << pi.name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, InterleavedStages,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama-tiny"), ::testing::Values(0, 1)));

// ZB-H1's split: every micro-batch's input-gradient pass first, the weight passes afterwards, as
// the last stage of a zero-bubble pipeline defers them. The same products in the same order per
// parameter: bitwise the gradients of forward_backward. Dense blocks of both families, MoE
// blocks (whose MLP is not deferred) beside dense ones, and 16-bit saved activations (re-read by
// the weight pass). The deferred gradients wait in activation buffers the input pass is done
// with: the split holds no more activation memory than the whole backward with as many slots
// (16-bit activations excepted: their gradients need buffers of their own).
TEST(SplitBackward, InputThenWeightPassesGiveTheWholeBackwardsGradients) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "llama-moe-tiny", "gpt2-tiny moe2", "llama-tiny bf16"}) {
    const std::string variant(name);
    ModelConfig cfg = preset(variant.substr(0, variant.find(' ')));
    const bool bf16 = variant.find("bf16") != std::string::npos;
    if (bf16) cfg.activation_dtype = DType::bf16;
    if (variant.find("moe2") != std::string::npos) {  // block 1 MoE, block 0 dense
      cfg.moe.num_experts = 4;
      cfg.moe.expert_d_ff = 32;
      cfg.moe.moe_every = 2;
    }
    Decoder whole(cfg), split(cfg), held(cfg);  // held: the whole backward, M slots in flight
    whole.init_weights(3);
    split.init_weights(3);
    held.init_weights(3);
    const int64_t B = 2, T = 8, M = 3, N = B * T;
    std::vector<std::vector<int32_t>> tok(M, std::vector<int32_t>(size_t(N))), tgt = tok;
    for (int m = 0; m < M; ++m)
      for (int64_t i = 0; i < N; ++i) {
        tok[size_t(m)][size_t(i)] = int32_t((i * 5 + m * 11) % cfg.vocab_size);
        tgt[size_t(m)][size_t(i)] = int32_t((i * 3 + m + 1) % cfg.vocab_size);
      }
    const double scale = 1.0 / double(M * N);
    std::vector<int> ids, held_ids;
    for (int m = 0; m < M; ++m) {
      held_ids.push_back(held.stage_begin(B, T, true));
      held.stage_forward(held_ids.back(), tok[size_t(m)].data(), tgt[size_t(m)].data(), scale);
      const double want = whole.forward_backward(tok[size_t(m)].data(), tgt[size_t(m)].data(), B, T, scale);
      ids.push_back(split.stage_begin(B, T, true));
      EXPECT_EQ(split.stage_forward(ids.back(), tok[size_t(m)].data(), tgt[size_t(m)].data(), scale), want) << name;
      split.stage_backward_input(ids.back(), {});
    }
    EXPECT_THROW(split.stage_backward_input(ids[0], {}), Error);  // its input pass ran already
    // Deferred so far: the attention projections' weight gradients are still zero.
    int deferred = 0;
    for (const auto& p : split.layout().params())
      if (p.product_operand && p.name.find("attn") != std::string::npos) {
        for (float g : split.grad(p.name).to_f32_vector()) ASSERT_EQ(g, 0.0f) << name << " " << p.name;
        ++deferred;
      }
    EXPECT_GT(deferred, 0) << name;
    for (int id : ids) split.stage_backward_weights(id);
    for (int id : held_ids) held.stage_backward(id, {});
    if (!bf16) {
      EXPECT_EQ(split.activation_bytes(), held.activation_bytes()) << name;
    } else {
      EXPECT_GT(split.activation_bytes(), held.activation_bytes()) << name;
    }
    EXPECT_THROW(split.stage_backward_weights(ids[0]), Error);  // released
    for (const auto& p : whole.layout().params())
      ASSERT_EQ(split.grad(p.name).to_f32_vector(), whole.grad(p.name).to_f32_vector()) << name << " " << p.name;
  }
  // Checkpointed blocks keep no activations for a later weight pass.
  DecoderOptions o;
  o.activation_checkpoint_interval = 1;
  Decoder ckpt(preset("gpt2-tiny"), o);
  std::vector<int32_t> tok(16, 1);
  const int id = ckpt.stage_begin(2, 8, true);
  ckpt.stage_forward(id, tok.data(), tok.data(), 1.0);
  EXPECT_THROW(ckpt.stage_backward_input(id, {}), Error);
}
