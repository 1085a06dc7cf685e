// Hugging Face interchange: config.json both ways (including real-world configs), parameter
// round trips for both families, GPT-2's Conv1D transposes, checkpoints written by GPT2Model,
// and the errors for missing/unexpected tensors, wrong shapes and unsupported settings.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "loom/io/file.h"
#include "loom/io/safetensors.h"
#include "loom/model/hf_weights.h"

using namespace loom;
using namespace loom::model;
namespace fs = std::filesystem;

namespace {

ModelConfig small(Family f, bool tied) {
  ModelConfig c = preset(f == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = f == Family::gpt2 ? 4 : 2;
  c.d_ff = f == Family::gpt2 ? 64 : 24;
  c.vocab_size = 23;
  c.n_ctx = 16;
  c.tied_embeddings = tied;
  return c;
}

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.n_ctx, b.n_ctx);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
}

// Rewrites a safetensors file through `edit` (name -> new name, "" drops the tensor).
void rewrite(const std::string& from, const std::string& to, const std::function<std::string(const std::string&)>& edit,
             const std::function<void(io::SafetensorsWriter&)>& extra = nullptr) {
  const auto f = io::SafetensorsFile::open(from);
  io::SafetensorsWriter w;
  for (const auto& e : f.entries()) {
    const std::string n = edit(e.name);
    if (!n.empty()) w.add(n, f.get(e.name).clone());
  }
  if (extra) extra(w);
  w.write(to);
}

}  // namespace

class HfRoundTrip : public ::testing::TestWithParam<std::tuple<Family, bool>> {};

TEST_P(HfRoundTrip, DecoderToFilesToDecoderIsExact) {
  const auto [family, tied] = GetParam();
  const ModelConfig cfg = small(family, tied);
  Decoder a(cfg);
  a.init_weights(7);
  // Give norms and biases non-trivial values so a mix-up between them would show.
  for (int64_t i = 0; i < a.num_params(); ++i) a.params().data<float>()[i] += 1e-3f * float(i % 97);
  const std::string dir = fresh_dir(str_cat("loom_hf_", family_name(family), tied));
  save_hf_pretrained(a, dir);

  const ModelConfig back = read_hf_config(dir + "/config.json");
  expect_same_config(back, cfg);
  Decoder b(back);
  load_hf_safetensors(b, dir + "/model.safetensors");
  ASSERT_EQ(a.num_params(), b.num_params());
  EXPECT_EQ(0, std::memcmp(a.params().raw(), b.params().raw(), a.params().nbytes()));

  const auto f = io::SafetensorsFile::open(dir + "/model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.contains("lm_head.weight"), !tied);  // save_pretrained drops a tied head
  size_t expect = a.layout().params().size();
  EXPECT_EQ(f.entries().size(), expect);
}

INSTANTIATE_TEST_SUITE_P(Families, HfRoundTrip,
                         ::testing::Values(std::tuple{Family::gpt2, true}, std::tuple{Family::gpt2, false},
                                           std::tuple{Family::llama, false}, std::tuple{Family::llama, true}));

TEST(HfWeights, Gpt2Conv1DWeightsAreStoredInOut) {
  Decoder m(small(Family::gpt2, true));
  m.init_weights(3);
  const std::string path = fresh_dir("loom_hf_conv1d") + "/model.safetensors";
  save_hf_safetensors(m, path);
  const auto f = io::SafetensorsFile::open(path);
  const std::string name = "transformer.h.1.mlp.c_fc.weight";  // loom [F, C], HF [C, F]
  const Tensor loom_w = m.param(name);
  const Tensor hf_w = f.get(name);
  ASSERT_EQ(hf_w.shape(), (Shape{16, 64}));
  for (int64_t o = 0; o < 64; o += 7)
    for (int64_t i = 0; i < 16; i += 3) ASSERT_EQ(hf_w.data<float>()[i * 64 + o], loom_w.data<float>()[o * 16 + i]);
  // Linear layers in LLaMA (nn.Linear) and GPT-2's embeddings keep loom's layout.
  EXPECT_EQ(f.get("transformer.wte.weight").shape(), (Shape{23, 16}));
}

TEST(HfWeights, ReducedPrecisionSaveLoadsBackRounded) {
  Decoder a(small(Family::llama, false));
  a.init_weights(5);
  const std::string path = fresh_dir("loom_hf_bf16") + "/model.safetensors";
  save_hf_safetensors(a, path, DType::bf16);
  EXPECT_EQ(io::SafetensorsFile::open(path).entry("model.norm.weight").dtype, DType::bf16);
  Decoder b(a.config());
  load_hf_safetensors(b, path);
  for (int64_t i = 0; i < a.num_params(); ++i)
    ASSERT_EQ(b.params().data<float>()[i], bf16_to_f32(f32_to_bf16(a.params().data<float>()[i])));
}

TEST(HfWeights, ReadsGpt2ModelCheckpointsWithBuffers) {
  // The original GPT-2 upload is a GPT2Model state dict: no "transformer." prefix, plus the
  // causal-mask buffers h.N.attn.bias / masked_bias, plus a tied lm_head copy elsewhere.
  Decoder a(small(Family::gpt2, true));
  a.init_weights(11);
  const std::string dir = fresh_dir("loom_hf_gpt2model");
  save_hf_safetensors(a, dir + "/full.safetensors");
  rewrite(
      dir + "/full.safetensors", dir + "/base.safetensors",
      [](const std::string& n) { return n.substr(std::string("transformer.").size()); },
      [](io::SafetensorsWriter& w) {
        for (int l = 0; l < 2; ++l) {
          w.add(str_cat("h.", l, ".attn.bias"), Tensor::zeros({1, 1, 16, 16}, DType::f32));
          w.add(str_cat("h.", l, ".attn.masked_bias"), Tensor::zeros({}, DType::f32));
        }
        w.add("lm_head.weight", Tensor::zeros({23, 16}, DType::f32));
      });
  Decoder b(a.config());
  load_hf_safetensors(b, dir + "/base.safetensors");
  EXPECT_EQ(0, std::memcmp(a.params().raw(), b.params().raw(), a.params().nbytes()));
}

TEST(HfWeights, ErrorsNameTheTensorAndBothShapes) {
  const std::string dir = fresh_dir("loom_hf_errors");
  Decoder gpt2(small(Family::gpt2, true));
  save_hf_safetensors(gpt2, dir + "/gpt2.safetensors");

  // Missing: drop one tensor.
  rewrite(dir + "/gpt2.safetensors", dir + "/missing.safetensors",
          [](const std::string& n) { return n == "transformer.h.1.ln_2.bias" ? std::string() : n; });
  std::string msg = error_of([&] { load_hf_safetensors(gpt2, dir + "/missing.safetensors"); });
  EXPECT_NE(msg.find("[hf] "), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing 1 tensor"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'transformer.h.1.ln_2.bias'"), std::string::npos) << msg;

  // Unexpected: an extra tensor.
  rewrite(
      dir + "/gpt2.safetensors", dir + "/extra.safetensors", [](const std::string& n) { return n; },
      [](io::SafetensorsWriter& w) { w.add("transformer.h.9.ln_1.weight", Tensor::zeros({16}, DType::f32)); });
  msg = error_of([&] { load_hf_safetensors(gpt2, dir + "/extra.safetensors"); });
  EXPECT_NE(msg.find("unexpected tensor for"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'transformer.h.9.ln_1.weight'"), std::string::npos) << msg;

  // Shape mismatch: a model with another d_ff.
  ModelConfig wide = gpt2.config();
  wide.d_ff = 32;
  Decoder other(wide);
  msg = error_of([&] { load_hf_safetensors(other, dir + "/gpt2.safetensors"); });
  EXPECT_NE(msg.find("tensor 'transformer.h.0.mlp.c_fc.bias' has shape [64] but gpt2-tiny"), std::string::npos) << msg;
  EXPECT_NE(msg.find("d_ff 32, vocab 23, context 16) expects [32]"), std::string::npos) << msg;
  // A Conv1D weight saved in loom's [out, in] layout by mistake gets the layout hint.
  rewrite(
      dir + "/gpt2.safetensors", dir + "/notransp.safetensors",
      [](const std::string& n) { return n == "transformer.h.0.mlp.c_fc.weight" ? std::string() : n; },
      [](io::SafetensorsWriter& w) {
        w.add("transformer.h.0.mlp.c_fc.weight", Tensor::zeros({64, 16}, DType::f32));
      });
  msg = error_of([&] { load_hf_safetensors(gpt2, dir + "/notransp.safetensors"); });
  EXPECT_NE(msg.find("tensor 'transformer.h.0.mlp.c_fc.weight' has shape [64, 16]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expects [16, 64] (Hugging Face's Conv1D layout [in, out])"), std::string::npos) << msg;

  // Wrong family: every name is unexpected and the hint says so.
  Decoder llama(small(Family::llama, false));
  msg = error_of([&] { load_hf_safetensors(llama, dir + "/gpt2.safetensors"); });
  EXPECT_NE(msg.find("wrong model family"), std::string::npos) << msg;

  // An untied head that is absent gets the tie_word_embeddings hint.
  save_hf_safetensors(llama, dir + "/llama.safetensors");
  rewrite(dir + "/llama.safetensors", dir + "/nohead.safetensors",
          [](const std::string& n) { return n == "lm_head.weight" ? std::string() : n; });
  msg = error_of([&] { load_hf_safetensors(llama, dir + "/nohead.safetensors"); });
  EXPECT_NE(msg.find("tie_word_embeddings"), std::string::npos) << msg;

  // Integer tensors are not parameters.
  rewrite(
      dir + "/llama.safetensors", dir + "/int.safetensors",
      [](const std::string& n) { return n == "model.norm.weight" ? std::string() : n; },
      [](io::SafetensorsWriter& w) { w.add("model.norm.weight", Tensor::zeros({16}, DType::i32)); });
  msg = error_of([&] { load_hf_safetensors(llama, dir + "/int.safetensors"); });
  EXPECT_NE(msg.find("floating point"), std::string::npos) << msg;
}

TEST(HfConfig, ReadsRealWorldConfigs) {
  // The published GPT-2 (124M) config.json, abridged only of task-specific fields.
  const char* gpt2 = R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": null, "vocab_size": 50257})";
  ModelConfig c = parse_hf_config(gpt2, "gpt2/config.json");
  expect_same_config(c, preset("gpt2-124m"));
  // A LLaMA-architecture model with grouped-query attention (TinyLlama-1.1B's shape).
  const char* llama = R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 32000})";
  c = parse_hf_config(llama, "llama/config.json");
  EXPECT_EQ(c.family, Family::llama);
  EXPECT_EQ(c.d_model, 2048);
  EXPECT_EQ(c.d_ff, 5632);
  EXPECT_EQ(c.n_head, 32);
  EXPECT_EQ(c.n_kv_head, 4);
  EXPECT_EQ(c.n_layer, 22);
  EXPECT_EQ(c.n_ctx, 2048);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_FALSE(c.tied_embeddings);
}

TEST(HfConfig, DefaultsFollowTransformers) {
  ModelConfig c = parse_hf_config(
      R"({"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":4,"vocab_size":100,"n_inner":null})", "c.json");
  EXPECT_EQ(c.d_ff, 256);  // n_inner null: 4 * n_embd
  EXPECT_EQ(c.n_ctx, 1024);
  EXPECT_TRUE(c.tied_embeddings);
  c = parse_hf_config(R"({"model_type":"llama","hidden_size":64,"intermediate_size":96,
      "num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100})",
                      "c.json");
  EXPECT_EQ(c.n_kv_head, 4);  // absent: multi-head attention
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tied_embeddings);
  // The config loom writes names every field, so HF's defaults never decide anything.
  ModelConfig custom = small(Family::gpt2, true);
  custom.d_ff = 48;
  expect_same_config(parse_hf_config(hf_config_json(custom), "w.json"), custom);
}

TEST(HfConfig, ErrorsNameTheKeyAndTheFix) {
  struct Case {
    const char* json;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"model_type":"gpt2","n_layer":2,"n_head":4,"vocab_size":100})", "missing key 'n_embd' (GPT2Config)"},
      {R"({"model_type":"gpt2","n_embd":"64","n_layer":2,"n_head":4,"vocab_size":100})",
       "n_embd should be an integer, got \"64\""},
      {R"({"model_type":"mistral"})", "model_type \"mistral\" is not supported"},
      {R"({"n_embd":64})", "model_type \"\" is not supported"},
      {R"({"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":4,"vocab_size":100,"activation_function":"gelu"})",
       "activation_function \"gelu\" is not supported"},
      {R"({"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":4,"vocab_size":100,"scale_attn_by_inverse_layer_idx":true})",
       "scale_attn_by_inverse_layer_idx=true is not supported"},
      {R"({"model_type":"llama","hidden_size":64,"intermediate_size":96,"num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,"rope_scaling":{"type":"dynamic","factor":2.0}})",
       "rope_scaling type \"dynamic\" is not supported"},
      {R"({"model_type":"llama","hidden_size":64,"intermediate_size":96,"num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,"attention_bias":true})",
       "attention_bias=true is not supported"},
      {R"({"model_type":"llama","hidden_size":64,"intermediate_size":96,"num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,"hidden_act":"gelu"})",
       "hidden_act=\"gelu\" is not supported"},
      {R"({"model_type":"llama","hidden_size":64,"intermediate_size":96,"num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,"head_dim":32})",
       "head_dim=32 is not supported"},
      {R"({"model_type":"gpt2",)", "not valid JSON"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { parse_hf_config(c.json, "x/config.json"); });
    EXPECT_NE(msg.find("[hf] x/config.json: "), std::string::npos) << c.json << "\n" << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.json << "\n" << msg;
  }
  // Values that parse but make no model fail the model's own validation, naming the field.
  const std::string msg = error_of([] {
    parse_hf_config(R"({"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":5,"vocab_size":100})", "c.json");
  });
  EXPECT_NE(msg.find("[config] model.n_head=5 does not divide model.d_model=64"), std::string::npos) << msg;
  EXPECT_THROW(read_hf_config("/nonexistent_loom/config.json"), Error);
}
