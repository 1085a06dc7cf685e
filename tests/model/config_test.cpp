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
  EXPECT_NE(error_of(c).find("model.n_head=5 does not divide model.d_model=32"), std::string::npos)
      << error_of(c);
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
