// The LLaMA-family variants of downloaded models (Qwen2's q/k/v biases, Llama 3.1's and linear
// RoPE scaling, tied and untied heads) against an independent float64 numpy model
// (tests/golden/families/make_golden.py): each tiny Hugging Face directory loads through
// model_source.h, and both the training forward (Decoder::logits) and the inference runner
// (paged KV cache, one prefill and then one token at a time) give its logits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/io/safetensors.h"
#include "loom/model/hf_weights.h"
#include "loom/model/model_source.h"

namespace loom {
namespace {

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/families";

struct Loaded {
  model::ModelCard card;
  std::unique_ptr<model::Decoder> model;
  std::vector<int32_t> tokens;
  Tensor want;  // [T, V]
};

Loaded load(const std::string& name) {
  Loaded l;
  const std::string dir = (kGolden / name).string();
  EXPECT_EQ(model::model_format(dir), model::ModelFormat::hf);
  l.card = model::read_model_card(dir);
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;
  l.model = std::make_unique<model::Decoder>(l.card.config, opt);
  model::load_model_weights(dir, l.card, *l.model);
  const io::SafetensorsFile g = io::SafetensorsFile::open((kGolden / name / "golden.safetensors").string());
  const Tensor t = g.get("tokens");
  l.tokens.assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  l.want = g.get("logits");
  return l;
}

double max_diff(const float* got, const Tensor& want, int64_t rows_from, int64_t rows) {
  const int64_t V = want.size(1);
  double worst = 0;
  for (int64_t i = 0; i < rows * V; ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want.data<float>()[rows_from * V + i])));
  return worst;
}

class ModelFamilies : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelFamilies, TrainingForwardMatchesTheReference) {
  Loaded l = load(GetParam());
  const int64_t T = int64_t(l.tokens.size()), V = l.card.config.vocab_size;
  Tensor out = Tensor::empty({1, T, V}, DType::f32);
  l.model->logits(l.tokens.data(), 1, T, out);
  EXPECT_LT(max_diff(out.data<float>(), l.want, 0, T), 2e-5) << l.card.config.summary();
}

TEST_P(ModelFamilies, InferenceRunnerMatchesTheReference) {
  Loaded l = load(GetParam());
  const model::ModelConfig& cfg = l.card.config;
  const int64_t T = int64_t(l.tokens.size()), V = cfg.vocab_size, bs = 4, nb = (T + bs - 1) / bs;
  infer::KVCache cache(cfg, nb, bs, DType::f32);
  infer::ModelRunner runner(*l.model, cache, T, 1, nullptr);
  std::vector<int32_t> table(static_cast<size_t>(nb));
  std::iota(table.begin(), table.end(), 0);
  // A prefill of the first half, then the rest one token at a time (decode reads the cache).
  const int64_t P = T / 2;
  for (int64_t start = 0; start < T;) {
    const int64_t n = start == 0 ? P : 1;
    infer::StepPlan plan;
    infer::ScheduledSeq s;
    s.seq_id = 0;
    s.start = start;
    s.num_tokens = n;
    s.tokens = std::span<const int32_t>(l.tokens.data() + start, size_t(n));
    s.block_table = table;
    plan.seqs.push_back(s);
    const Tensor logits = runner.execute_all_rows(plan);
    ASSERT_EQ(logits.numel(), n * V);
    EXPECT_LT(max_diff(logits.data<float>(), l.want, start, n), 2e-5) << cfg.summary() << " at position " << start;
    start += n;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, ModelFamilies, ::testing::Values("qwen2", "llama3_scaled", "llama_linear"));

TEST(ModelFamilies, ConfigsReadAndWriteTheirVariants) {
  const model::ModelCard q = model::read_model_card((kGolden / "qwen2").string());
  EXPECT_TRUE(q.config.qkv_bias);
  EXPECT_TRUE(q.config.tied_embeddings);
  EXPECT_EQ(q.config.rope_theta, 1e6);
  const model::ModelCard l3 = model::read_model_card((kGolden / "llama3_scaled").string());
  EXPECT_EQ(l3.config.rope_scaling.type, model::RopeScaling::Type::llama3);
  EXPECT_EQ(l3.config.rope_scaling.factor, 8.0);
  EXPECT_EQ(l3.config.rope_scaling.original_max_position, 64);
  EXPECT_FALSE(l3.config.tied_embeddings);
  // config.json written back reads as the same model.
  for (const model::ModelCard* c : {&q, &l3}) {
    const model::ModelConfig back = model::parse_hf_config(model::hf_config_json(c->config), "round trip");
    EXPECT_EQ(back.qkv_bias, c->config.qkv_bias);
    EXPECT_EQ(back.rope_scaling.type, c->config.rope_scaling.type);
    EXPECT_EQ(back.rope_scaling.factor, c->config.rope_scaling.factor);
    EXPECT_EQ(back.rope_inv_freq(), c->config.rope_inv_freq());
  }
  // Scaling types loom does not compute are refused by name.
  auto error = [](const std::string& json) -> std::string {
    try {
      model::parse_hf_config(json, "config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string base =
      R"({"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, )";
  EXPECT_NE(error(base + R"("rope_scaling": {"rope_type": "yarn", "factor": 4}})").find("\"yarn\" is not supported"),
            std::string::npos);
  EXPECT_NE(error(base + R"("attention_bias": true})").find("attention_bias"), std::string::npos);
}

}  // namespace
}  // namespace loom
