// SentencePiece-style ("llama") GGUF vocabularies against llama.cpp: the ids and detokenized
// bytes llama.cpp gives for tests/golden/gguf_spm/vocab.gguf (made by make_golden.py there) on
// a multilingual corpus and all of Tiny Shakespeare, and small vocabularies written here whose
// ids are worked out by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/data_testing.h"
#include "loom/data/gguf_tokenizer.h"
#include "loom/data/shard_format.h"
#include "loom/io/gguf.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/gguf_spm";

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// A golden string field: `key`, or `key`_hex where the bytes are not UTF-8.
std::string bytes_field(const nlohmann::json& j, const std::string& key) {
  if (j.contains(key)) return j.at(key).get<std::string>();
  return from_hex(j.at(key + "_hex").get<std::string>());
}

std::vector<int32_t> ids_field(const nlohmann::json& j, const std::string& key) {
  return j.at(key).get<std::vector<int32_t>>();
}

// What llama_tokenize(text, add_special = true, parse_special = true) returns, from loom's parts.
std::vector<int32_t> with_specials(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  if (tok.add_bos()) ids.push_back(*tok.bos_id());
  tok.encode_special_append(text, ids);
  if (tok.add_eos()) ids.push_back(*tok.eos_id());
  return ids;
}

const nlohmann::json& golden() {
  static const nlohmann::json g = nlohmann::json::parse(read_bytes(kGolden / "ids.json"));
  return g;
}

TEST(GgufSpmTokenizer, MatchesLlamaCppOnEveryCase) {
  auto tok = make_tokenizer((kGolden / "vocab.gguf").string());
  EXPECT_EQ(tok->vocab_size(), 3009);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->token_text(3 + 0x41), "<0x41>");
  EXPECT_EQ(tok->token_id("<|im_start|>"), 1062);
  EXPECT_TRUE(tok->is_special(0));                           // <unk>
  EXPECT_TRUE(tok->is_special(2));                           // </s>
  EXPECT_FALSE(tok->is_special(68));                         // <0x41>
  EXPECT_FALSE(tok->is_special(*tok->token_id("wordtok")));  // user-defined

  int compared = 0;
  for (const auto& c : golden().at("cases")) {
    const std::string name = c.at("name").get<std::string>(), text = bytes_field(c, "text");
    SCOPED_TRACE("case " + name);
    const std::vector<int32_t> ids = ids_field(c, "ids"), plain = ids_field(c, "plain");
    EXPECT_EQ(with_specials(*tok, text), ids);
    EXPECT_EQ(tok->encode(text), plain);
    EXPECT_EQ(tok->decode_skip_special(ids), bytes_field(c, "decoded"));
    EXPECT_EQ(tok->decode(ids), bytes_field(c, "decoded_special"));
    EXPECT_EQ(tok->decode_skip_special(plain), bytes_field(c, "plain_decoded"));
    ++compared;
  }
  EXPECT_GE(compared, 53);
}

TEST(GgufSpmTokenizer, DecodesTokensEncodingNeverMakesAsLlamaCpp) {
  auto tok = make_tokenizer((kGolden / "vocab.gguf").string());
  int compared = 0;
  for (const auto& c : golden().at("decode_cases")) {
    const std::vector<int32_t> ids = ids_field(c, "ids");
    SCOPED_TRACE("ids " + c.at("ids").dump());
    EXPECT_EQ(tok->decode_skip_special(ids), bytes_field(c, "decoded"));
    EXPECT_EQ(tok->decode(ids), bytes_field(c, "decoded_special"));
    ++compared;
  }
  EXPECT_GE(compared, 8);
}

// One piece of text 1.1 MB long: every merge of the whole file, against a hash of llama.cpp's ids.
TEST(GgufSpmTokenizer, TinyShakespeareMatchesLlamaCpp) {
  auto tok = make_tokenizer((kGolden / "vocab.gguf").string());
  const std::string text = read_bytes(std::filesystem::path(testing::repo_data_dir()) / "tinyshakespeare/input.txt");
  const std::vector<int32_t> ids = tok->encode(text);
  const nlohmann::json& g = golden().at("tinyshakespeare");
  EXPECT_EQ(ids.size(), g.at("plain_tokens").get<size_t>());
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx",
                static_cast<unsigned long long>(fnv1a64(ids.data(), ids.size() * sizeof(int32_t))));
  EXPECT_EQ(std::string(hash), g.at("plain_fnv1a64").get<std::string>());
}

// vocab.gguf with add_space_prefix = false, add_bos_token = false and add_eos_token = true,
// as make_golden.py writes it for llama.cpp.
TEST(GgufSpmTokenizer, FlagsVariantMatchesLlamaCpp) {
  const io::GgufFile base = io::GgufFile::open((kGolden / "vocab.gguf").string());
  io::GgufWriter w;
  for (const auto& [key, value] : base.metadata()) w.set(key, value);
  w.set("tokenizer.ggml.add_space_prefix", io::gguf_bool(false));
  w.set("tokenizer.ggml.add_bos_token", io::gguf_bool(false));
  w.set("tokenizer.ggml.add_eos_token", io::gguf_bool(true));
  ScratchDir dir;
  const std::string path = (dir / "variant.gguf").string();
  w.write(path);
  auto tok = make_tokenizer(path);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->add_eos());
  int compared = 0;
  for (const auto& c : golden().at("cases")) {
    SCOPED_TRACE("case " + c.at("name").get<std::string>());
    EXPECT_EQ(with_specials(*tok, bytes_field(c, "text")), ids_field(c, "variant"));
    ++compared;
  }
  EXPECT_GE(compared, 53);
  // Without add_space_prefix no leading space is cut either.
  const std::vector<int32_t> space_a = {3 + 0x20, 3 + 0x41};
  EXPECT_EQ(tok->decode(space_a), " A");
}

// Pieces: <unk> <s> </s> ▁ a aa b ab ▁b ▁ab, scores chosen so each expectation below follows.
void write_tiny_spm(const std::string& path, bool byte_tokens) {
  std::vector<std::string> pieces = {"<unk>",
                                     "<s>",
                                     "</s>",
                                     "\xE2\x96\x81",
                                     "a",
                                     "aa",
                                     "b",
                                     "ab",
                                     "\xE2\x96\x81"
                                     "b",
                                     "\xE2\x96\x81"
                                     "ab"};
  std::vector<double> scores = {0, 0, 0, -1, -1, -2, -1, -3, -2, -4};
  std::vector<int> types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  if (byte_tokens) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      pieces.push_back(name);
      scores.push_back(0);
      types.push_back(6);
    }
  }
  io::GgufWriter w;
  w.set("general.architecture", io::gguf_string("llama"));
  w.set("tokenizer.ggml.model", io::gguf_string("llama"));
  w.set("tokenizer.ggml.tokens", io::gguf_strings(pieces));
  std::vector<io::GgufValue> s, t;
  for (double x : scores) s.push_back(io::gguf_float(x));
  for (int x : types) t.push_back(io::gguf_int(x));
  w.set("tokenizer.ggml.scores", io::gguf_array(io::GgufType::f32, s));
  w.set("tokenizer.ggml.token_type", io::gguf_array(io::GgufType::i32, t));
  w.write(path);  // no bos/eos/unk ids and no add_* flags: llama.cpp's defaults apply
}

TEST(GgufSpmTokenizer, TiesGoLeftmostAndMissingBytesFallBack) {
  ScratchDir dir;
  const std::string path = (dir / "tiny.gguf").string();
  write_tiny_spm(path, true);
  auto tok = make_tokenizer(path);
  EXPECT_TRUE(tok->add_bos());  // defaults: BOS 1, EOS 2, unknown 0, add_bos, space prefix
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  // "▁aaa": a+a ties at positions 1 and 2; the leftmost merges, leaving ▁ aa a.
  EXPECT_EQ(tok->encode("aaa"), (std::vector<int32_t>{3, 5, 4}));
  // "▁ab": ▁+a is no piece, so a+b (-3) merges, then ▁+ab (-4).
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{9}));
  // "▁a▁b": only ▁+b is a piece.
  EXPECT_EQ(tok->encode("a b"), (std::vector<int32_t>{3, 4, 8}));
  // é (C3 A9) is no piece: its bytes.
  EXPECT_EQ(tok->encode("\xC3\xA9"), (std::vector<int32_t>{3, 10 + 0xC3, 10 + 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("a \xC3\xA9")), "a \xC3\xA9");
  EXPECT_TRUE(tok->encode("").empty());

  write_tiny_spm(path, false);
  auto no_bytes = make_tokenizer(path);
  EXPECT_EQ(no_bytes->encode("\xC3\xA9"), (std::vector<int32_t>{3, 0, 0}));  // each byte: the unknown token
}

TEST(GgufSpmTokenizer, RefusesOtherModelsNamingTheKey) {
  ScratchDir dir;
  const std::string path = (dir / "other.gguf").string();
  for (const std::string model : {"bert", "t5", "rwkv"}) {
    io::GgufWriter w;
    w.set("tokenizer.ggml.model", io::gguf_string(model));
    w.set("tokenizer.ggml.tokens", io::gguf_strings({"a", "b"}));
    w.write(path);
    const std::string e = error_of([&] { make_tokenizer(path); });
    EXPECT_NE(e.find("tokenizer.ggml.model '" + model + "' is not supported"), std::string::npos) << e;
    EXPECT_NE(e.find("\"gpt2\""), std::string::npos) << e;
    EXPECT_NE(e.find("\"llama\""), std::string::npos) << e;
  }
}

TEST(GgufSpmTokenizer, RefusesCorruptVocabularies) {
  ScratchDir dir;
  const std::string path = (dir / "bad.gguf").string();
  io::GgufWriter w;
  w.set("tokenizer.ggml.model", io::gguf_string("llama"));
  w.set("tokenizer.ggml.tokens", io::gguf_strings({"<unk>", "<s>", "</s>", "a", "a"}));
  w.write(path);
  const std::string dup = error_of([&] { make_tokenizer(path); });
  EXPECT_NE(dup.find("pieces 3 and 4 are both 'a'"), std::string::npos) << dup;

  w.set("tokenizer.ggml.tokens", io::gguf_strings({"<unk>", "<s>", "</s>", "a", "b"}));
  w.set("tokenizer.ggml.bos_token_id", io::gguf_uint(7));
  w.write(path);
  const std::string bos = error_of([&] { make_tokenizer(path); });
  EXPECT_NE(bos.find("tokenizer.ggml.bos_token_id = 7 is outside the vocabulary"), std::string::npos) << bos;
}

}  // namespace
}  // namespace loom::data
