// What a model path names (model/model_source.h): a Hugging Face directory written by
// save_hf_pretrained with its tokenizer and generation configs reads back as a card (name,
// chat template, end tokens) and the same weights, whole or in safetensors shards; damaged
// shard sets are refused naming the shard or tensor; GGUF files, loom checkpoints and paths
// that are neither are told apart.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/io/file.h"
#include "loom/io/safetensors.h"
#include "loom/model/hf_weights.h"
#include "loom/model/model_source.h"
#include "testing/errors.h"
#include "testing/gguf_fixture.h"
#include "testing/tiny_models.h"

using namespace loom;
using namespace loom::model;
using loom::testing::error_of;
namespace fs = std::filesystem;
using loom::testing::tiny_llama;
using nlohmann::json;

namespace {

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

const char* kTemplate = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

// dir: config.json and model.safetensors from save_hf_pretrained, the tokenizer config with a
// chat template and an eos token, and a generation config listing two end ids.
void write_hf_dir(const Decoder& m, const std::string& dir) {
  save_hf_pretrained(m, dir);
  const json tc = {{"chat_template", kTemplate}, {"eos_token", "<|im_end|>"}, {"bos_token", {{"content", "<s>"}}}};
  io::write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), tc.dump());
  io::write_file_atomic((fs::path(dir) / "generation_config.json").string(), json({{"eos_token_id", {2, 5}}}).dump());
}

void expect_same_params(const Decoder& a, const Decoder& b) {
  ASSERT_EQ(a.flat_size(), b.flat_size());
  for (const ParamInfo& p : a.layout().params()) {
    const Tensor x = a.param(p.name), y = b.param(p.name);
    EXPECT_EQ(std::memcmp(x.data<float>(), y.data<float>(), size_t(x.numel()) * sizeof(float)), 0) << p.name;
  }
}

// The shards of dir/model.safetensors: tensor i into shard i % 2, unless `place` says where
// (0, 1 or 2 for both); writes the index and removes model.safetensors.
void shard(const std::string& dir, const std::function<int(const std::string&, size_t)>& place = nullptr) {
  const fs::path d(dir);
  const auto f = io::SafetensorsFile::open((d / "model.safetensors").string());
  const char* names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  io::SafetensorsWriter w[2];
  json map = json::object();
  for (size_t i = 0; i < f.entries().size(); ++i) {
    const std::string& n = f.entries()[i].name;
    const int where = place ? place(n, i) : int(i % 2);
    for (int s = 0; s < 2; ++s)
      if (where == s || where == 2) w[s].add(n, f.get(n).clone());
    map[n] = names[where == 2 ? 0 : where];
  }
  for (int s = 0; s < 2; ++s) w[s].write((d / names[s]).string());
  io::write_file_atomic((d / "model.safetensors.index.json").string(),
                        json({{"metadata", {{"total_size", 0}}}, {"weight_map", map}}).dump());
  fs::remove(d / "model.safetensors");
}

}  // namespace

TEST(HfDirectory, ReadsTheCardAndTheWeights) {
  Decoder src(tiny_llama());
  src.init_weights(3);
  const std::string dir = fresh_dir("tiny-hf-model");
  write_hf_dir(src, dir);
  EXPECT_EQ(model_format(dir), ModelFormat::hf);
  const ModelCard card = read_model_card(dir);
  EXPECT_EQ(card.format, ModelFormat::hf);
  EXPECT_EQ(card.name, "tiny-hf-model");
  EXPECT_EQ(card.config.name, "tiny-hf-model");
  EXPECT_EQ(card.tokenizer, dir);
  EXPECT_EQ(card.chat_template, kTemplate);
  EXPECT_NE(card.chat_template_source.find("tokenizer_config.json:chat_template"), std::string::npos);
  EXPECT_EQ(card.eos_token, "<|im_end|>");
  EXPECT_EQ(card.bos_token, "<s>");
  EXPECT_EQ(card.end_ids, (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(card.end_tokens, (std::vector<std::string>{"<|im_end|>"}));
  EXPECT_EQ(card.config.n_kv_head, 2);
  EXPECT_FALSE(card.config.tied_embeddings);
  Decoder dst(card.config);
  const std::string how = load_model_weights(dir, card, dst);
  EXPECT_NE(how.find("1 safetensors file in"), std::string::npos) << how;
  expect_same_params(src, dst);
  // A trailing slash names the same directory.
  EXPECT_EQ(read_model_card(dir + "/").name, "tiny-hf-model");
}

TEST(HfDirectory, ShardedWeightsLoadAsOne) {
  Decoder src(tiny_llama());
  src.init_weights(4);
  const std::string dir = fresh_dir("tiny-hf-sharded");
  write_hf_dir(src, dir);
  shard(dir);
  ASSERT_FALSE(fs::exists(fs::path(dir) / "model.safetensors"));
  const ModelCard card = read_model_card(dir);
  Decoder dst(card.config);
  const std::string how = load_model_weights(dir, card, dst);
  EXPECT_NE(how.find("2 safetensors files in"), std::string::npos) << how;
  expect_same_params(src, dst);
}

TEST(HfDirectory, MissingShardIsNamed) {
  Decoder src(tiny_llama());
  const std::string dir = fresh_dir("tiny-hf-missing-shard");
  write_hf_dir(src, dir);
  shard(dir);
  fs::remove(fs::path(dir) / "model-00002-of-00002.safetensors");
  const ModelCard card = read_model_card(dir);
  Decoder dst(card.config);
  const std::string e = error_of([&] { load_model_weights(dir, card, dst); });
  EXPECT_NE(e.find("names shard model-00002-of-00002.safetensors, which is missing"), std::string::npos) << e;
}

TEST(HfDirectory, TensorInTwoShardsIsNamed) {
  Decoder src(tiny_llama());
  const std::string dir = fresh_dir("tiny-hf-twice");
  write_hf_dir(src, dir);
  const std::string twice = "model.layers.1.mlp.up_proj.weight";
  shard(dir, [&](const std::string& n, size_t i) { return n == twice ? 2 : int(i % 2); });
  const ModelCard card = read_model_card(dir);
  Decoder dst(card.config);
  const std::string e = error_of([&] { load_model_weights(dir, card, dst); });
  EXPECT_NE(e.find("parameter '" + twice + "' appears twice"), std::string::npos) << e;
}

TEST(HfDirectory, NoWeightsIsExplained) {
  Decoder src(tiny_llama());
  const std::string dir = fresh_dir("tiny-hf-no-weights");
  write_hf_dir(src, dir);
  fs::remove(fs::path(dir) / "model.safetensors");
  const ModelCard card = read_model_card(dir);
  Decoder dst(card.config);
  const std::string e = error_of([&] { load_model_weights(dir, card, dst); });
  EXPECT_NE(e.find("has neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << e;
}

TEST(ModelFormatOf, GgufFileAndItsCard) {
  ModelConfig c = tiny_llama();
  c.d_model = 32;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.d_ff = 64;
  c.vocab_size = 257;
  c.name = "tiny gguf";
  Decoder m(c);
  loom::testing::GgufFixture f;
  f.tokenizer = true;
  f.chat_template = kTemplate;
  const std::string path = (fs::path(::testing::TempDir()) / "card.gguf").string();
  loom::testing::gguf_writer_of(m, f).write(path);
  EXPECT_EQ(model_format(path), ModelFormat::gguf);
  const ModelCard card = read_model_card(path);
  EXPECT_EQ(card.format, ModelFormat::gguf);
  EXPECT_EQ(card.name, "card");              // the file's stem, as the user named it
  EXPECT_EQ(card.config.name, "tiny gguf");  // general.name
  EXPECT_EQ(card.tokenizer, path);
  EXPECT_EQ(card.chat_template, kTemplate);
  EXPECT_EQ(card.eos_token, "<|endoftext|>");
  EXPECT_EQ(card.end_ids, (std::vector<int32_t>{256}));
}

TEST(ModelFormatOf, LoomCheckpointAndRunDirectory) {
  const std::string ckpt = fresh_dir("format-loom-checkpoint");
  io::write_file_atomic((fs::path(ckpt) / "manifest.json").string(), "{}");
  io::write_file_atomic((fs::path(ckpt) / "config.json").string(), "{}");  // a checkpoint has one too
  EXPECT_EQ(model_format(ckpt), ModelFormat::loom);
  const std::string e = error_of([&] { read_model_card(ckpt); });
  EXPECT_NE(e.find("is a loom checkpoint"), std::string::npos) << e;
  EXPECT_EQ(model_format(fresh_dir("format-run-dir")), ModelFormat::loom);  // resolve_checkpoint judges it
}

TEST(ModelFormatOf, OtherFileIsNamed) {
  const std::string path = (fs::path(::testing::TempDir()) / "weights.bin").string();
  io::write_file_atomic(path, "PK\x03\x04 not a gguf file");
  const std::string e = error_of([&] { model_format(path); });
  EXPECT_NE(e.find(path + " is a file but not a GGUF file"), std::string::npos) << e;
}

TEST(ModelFormatOf, MissingPathIsNamed) {
  const std::string path = (fs::path(::testing::TempDir()) / "no-such-model").string();
  const std::string e = error_of([&] { model_format(path); });
  EXPECT_NE(e.find(path + " does not exist"), std::string::npos) << e;
}
