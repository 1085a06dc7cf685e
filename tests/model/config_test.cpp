// Impossible model configs are rejected with a message naming the field.
#include <gtest/gtest.h>

#include "loom/model/decoder.h"

using namespace loom;
using namespace loom::model;

static std::string error_of(ModelConfig c) {
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, RejectsImpossibleShapesNamingTheField) {
  ModelConfig c = preset("gpt2-tiny");
  c.n_head = 5;
  EXPECT_NE(error_of(c).find("model.n_head=5 does not divide model.d_model=32"), std::string::npos) << error_of(c);
  c = preset("llama-tiny");
  c.n_kv_head = 3;
  EXPECT_NE(error_of(c).find("model.n_kv_head=3 does not divide model.n_head=4"), std::string::npos);
  c = preset("gpt2-tiny");
  c.d_model = 0;
  EXPECT_NE(error_of(c).find("model.d_model must be positive"), std::string::npos);
  c = preset("gpt2-tiny");
  c.n_layer = -1;
  EXPECT_NE(error_of(c).find("model.n_layer"), std::string::npos);
  EXPECT_THROW(preset("gpt5"), Error);
}

TEST(ModelConfig, Gpt2SmallHasTheKnownParameterCount) {
  ParamLayout l(preset("gpt2-124m"));
  EXPECT_EQ(l.total(), 124439808);  // Hugging Face gpt2, tied head counted once
  EXPECT_EQ(l.get("transformer.h.0.attn.c_attn.weight").shape, Shape({2304, 768}));
  ParamLayout q(preset("llama-tiny"));
  auto a = q.get("model.layers.1.self_attn.q_proj.weight");
  auto k = q.get("model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(a.offset + a.numel(), k.offset);
}

TEST(ModelConfig, SequenceLongerThanContextIsRefused) {
  Decoder m(preset("gpt2-tiny"));
  std::vector<int32_t> tok(65, 1);
  try {
    m.forward(tok.data(), tok.data(), 1, 65);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the context of 64"), std::string::npos);
  }
}

TEST(ParamLayout, UnitsArePaddedAndShardedInitMatchesWholeInit) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig cfg = preset(name);
    ParamLayout plain(cfg), padded(cfg, 3);
    EXPECT_EQ(plain.num_params(), padded.num_params());
    ASSERT_EQ(padded.units().size(), size_t(cfg.n_layer + 2));
    EXPECT_EQ(padded.units().front().name, "embed");
    EXPECT_EQ(padded.units().back().name, "head");
    int64_t expect_begin = 0;
    for (const auto& u : padded.units()) {
      EXPECT_EQ(u.begin, expect_begin);
      EXPECT_EQ(u.size() % 3, 0) << u.name;
      expect_begin = u.end;
    }
    EXPECT_EQ(expect_begin, padded.total());
    EXPECT_EQ(padded.block_range(1).first, padded.block_unit(1).begin);
    // Initialising three shards separately gives the whole-buffer initialisation.
    std::vector<float> whole(size_t(padded.total())), parts(size_t(padded.total()));
    init_params(padded, 9, whole.data());
    const int64_t third = padded.total() / 3;
    for (int r = 0; r < 3; ++r)
      init_params_range(padded, 9, r * third, r == 2 ? padded.total() : (r + 1) * third, parts.data() + r * third);
    EXPECT_EQ(whole, parts);
    // Same values under their names as without padding.
    std::vector<float> ref(size_t(plain.total()));
    init_params(plain, 9, ref.data());
    for (const auto& p : plain.params())
      for (int64_t i = 0; i < p.numel(); i += 7)
        ASSERT_EQ(ref[size_t(p.offset + i)], whole[size_t(padded.get(p.name).offset + i)]) << p.name;
  }
}
