// Tokenizers from GGUF metadata: SmolLM2-135M-Instruct's real vocabulary against the ids
// Hugging Face `tokenizers` gives (tests/golden/hf_tokenizers/smollm2_gguf, made by
// make_golden.py), and small GGUF files written here for the refusals and token types.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "data/data_testing.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/gguf_tokenizer.h"
#include "loom/io/gguf.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/hf_tokenizers";

std::string smollm2_path() {
  if (const char* env = std::getenv("LOOM_TEST_MODEL"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufTokenizer, SmolLM2MatchesTokenizersOnEveryCase) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "SmolLM2 GGUF not found at " << path << ": run scripts/fetch-test-model.sh";
  auto tok = make_tokenizer(path);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->token_text(2), "<|im_end|>");
  EXPECT_EQ(tok->token_id("<|im_start|>"), 1);
  for (int32_t id = 0; id < 17; ++id) EXPECT_TRUE(tok->is_special(id)) << id;
  EXPECT_FALSE(tok->is_special(17));

  const nlohmann::json golden = nlohmann::json::parse(read_bytes(kGolden / "smollm2_gguf/ids.json"));
  int compared = 0;
  for (const auto& c : nlohmann::json::parse(read_bytes(kGolden / "corpus.json"))) {
    const std::string name = c.at("name").get<std::string>(), text = c.at("text").get<std::string>();
    SCOPED_TRACE("case " + name);
    const nlohmann::json& g = golden.at(name);
    EXPECT_EQ(tok->encode_special(text), g.at("ids").get<std::vector<int32_t>>());
    EXPECT_EQ(tok->encode(text), g.at("plain").get<std::vector<int32_t>>());
    const std::string decoded = g.at("decoded").get<std::string>();
    if (decoded.find("\xEF\xBF\xBD") == std::string::npos) {
      EXPECT_EQ(tok->decode_skip_special(g.at("ids").get<std::vector<int32_t>>()), decoded);
    }
    ++compared;
  }
  EXPECT_GE(compared, 35);
}

TEST(GgufTokenizer, SmolLM2DropsBytesItsVocabularyLacks) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "SmolLM2 GGUF not found at " << path << ": run scripts/fetch-test-model.sh";
  auto tok = make_tokenizer(path);
  int present = 0;
  std::vector<int> missing_ascii;
  for (int b = 0; b < 256; ++b) {
    if (tok->token_id(byte_level_char(uint8_t(b)))) {
      ++present;
    } else if (b < 0x80) {
      missing_ascii.push_back(b);
    }
  }
  EXPECT_EQ(present, 235);
  ASSERT_FALSE(missing_ascii.empty());
  for (int b : missing_ascii) {  // `tokenizers` (no unk_token) and llama.cpp drop them
    const std::string text = std::string("a") + char(b) + "a";
    EXPECT_EQ(tok->decode(tok->encode(text)), "aa") << "byte " << b;
  }
}

// A GGUF with a five-letter byte-level vocabulary: a b ab c and two control tokens.
void write_small_gguf(const std::string& path, const std::string& model, const std::string& pre) {
  io::GgufWriter w;
  w.set("tokenizer.ggml.model", io::gguf_string(model));
  w.set("tokenizer.ggml.pre", io::gguf_string(pre));
  w.set("tokenizer.ggml.tokens", io::gguf_strings({"<s>", "</s>", "a", "b", "ab", "c", "Ġ", "Ġab", "<extra>"}));
  std::vector<io::GgufValue> types;
  for (int t : {3, 3, 1, 1, 1, 1, 1, 1, 4}) types.push_back(io::gguf_int(t));
  w.set("tokenizer.ggml.token_type", io::gguf_array(io::GgufType::i32, types));
  w.set("tokenizer.ggml.merges", io::gguf_strings({"a b", "Ġ ab"}));
  w.set("tokenizer.ggml.bos_token_id", io::gguf_uint(0));
  w.set("tokenizer.ggml.eos_token_id", io::gguf_uint(1));
  w.set("tokenizer.ggml.add_bos_token", io::gguf_bool(true));
  w.write(path);
}

TEST(GgufTokenizer, SmallVocabularyTokenTypesAndBos) {
  ScratchDir dir;
  const std::string path = (dir / "small.gguf").string();
  write_small_gguf(path, "gpt2", "default");
  auto tok = make_tokenizer(path);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->encode("ab ab c"), (std::vector<int32_t>{4, 7, 6, 5}));
  EXPECT_EQ(tok->encode("ab<s>"), (std::vector<int32_t>{4}));  // '<', 's', '>' have no tokens: dropped
  EXPECT_EQ(tok->encode_special("ab<s>"), (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(tok->encode("a<extra>"), (std::vector<int32_t>{2, 8}));  // user-defined: always split out
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(8));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{0, 4, 7}), "<s>ab ab");
  EXPECT_EQ(tok->decode_skip_special(std::vector<int32_t>{0, 4, 7}), "ab ab");
}

TEST(GgufTokenizer, RefusesUnknownPreTokenizersAndModels) {
  ScratchDir dir;
  const std::string path = (dir / "small.gguf").string();
  write_small_gguf(path, "gpt2", "deepseek-coder");
  const std::string pre = error_of([&] { make_tokenizer(path); });
  EXPECT_NE(pre.find("tokenizer.ggml.pre 'deepseek-coder' is not supported"), std::string::npos) << pre;
  write_small_gguf(path, "bert", "default");
  const std::string model = error_of([&] { make_tokenizer(path); });
  EXPECT_NE(model.find("tokenizer.ggml.model 'bert' is not supported"), std::string::npos) << model;
}

}  // namespace
}  // namespace loom::data
