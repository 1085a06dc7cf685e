// Writing tokenizers for other programs (data/bpe_vocabulary.h, tokenizer_export.h): every
// vocabulary written as tokenizer.json and as GGUF keys encodes every text of the multilingual
// corpus (tests/golden/hf_tokenizers/corpus.json) to the ids its source gives, read back by
// loom's readers of those forms. SmolLM2's real GGUF vocabulary written as tokenizer.json gives
// the ids Hugging Face `tokenizers` gives (smollm2_gguf/ids.json, when the GGUF is cached).
// SentencePiece-style vocabularies are refused, naming the fix.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "data/data_testing.h"
#include "loom/data/bpe_vocabulary.h"
#include "loom/data/gguf_tokenizer.h"
#include "loom/data/hf_tokenizer.h"
#include "loom/data/tokenizer_export.h"
#include "loom/io/gguf.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/hf_tokenizers";

std::vector<std::pair<std::string, std::string>> corpus() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : nlohmann::json::parse(read_bytes(kGolden / "corpus.json")))
    out.emplace_back(c.at("name").get<std::string>(), c.at("text").get<std::string>());
  out.emplace_back("shakespeare", read_bytes(testing::repo_data_dir() + "/tinyshakespeare/input.txt").substr(0, 4000));
  return out;
}

// loom's reader of the tokenizer.json text (written to `dir`, with a tokenizer_config.json when given).
std::unique_ptr<Tokenizer> from_json(const std::string& text, const std::filesystem::path& dir,
                                     const std::string& config = "") {
  std::filesystem::create_directories(dir);
  write_bytes(dir / "tokenizer.json", text);
  if (!config.empty()) write_bytes(dir / "tokenizer_config.json", config);
  return load_hf_tokenizer((dir / "tokenizer.json").string());
}

// loom's reader of the GGUF keys `v` makes.
std::unique_ptr<Tokenizer> from_gguf(const ByteLevelVocabulary& v, const std::filesystem::path& path) {
  io::GgufWriter w;
  w.set("general.architecture", io::gguf_string("llama"));
  set_gguf_vocabulary(v, w);
  w.write(path.string());
  return load_gguf_tokenizer(path.string());
}

// Both encodings of every corpus text, special tokens read as tokens and as text, and the
// bos/eos ids the caller prepends.
void expect_same_ids(const Tokenizer& want, const Tokenizer& got, const std::vector<std::string>& skip = {}) {
  EXPECT_EQ(got.bos_id(), want.bos_id());
  EXPECT_EQ(got.eos_id(), want.eos_id());
  EXPECT_EQ(got.add_bos(), want.add_bos());
  for (const auto& [name, text] : corpus()) {
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    SCOPED_TRACE("case " + name);
    EXPECT_EQ(got.encode(text), want.encode(text));
    EXPECT_EQ(got.encode_special(text), want.encode_special(text));
  }
}

TEST(TokenizerExport, ByteTokenizerIsAByteLevelBpeWithoutMerges) {
  ScratchDir d;
  const ByteLevelVocabulary v = byte_vocabulary();
  const ByteTokenizer bytes;
  const auto json = from_json(tokenizer_json(v), d.path() / "json");
  const auto gguf = from_gguf(v, d.path() / "byte.gguf");
  for (const auto& [name, text] : corpus()) {
    SCOPED_TRACE("case " + name);
    EXPECT_EQ(json->encode(text), bytes.encode(text));
    EXPECT_EQ(gguf->encode(text), bytes.encode(text));
    EXPECT_EQ(json->decode(bytes.encode(text)), text);
  }
}

TEST(TokenizerExport, Gpt2FilesEncodeAsLoomsGpt2Tokenizer) {
  ScratchDir d;
  const ByteLevelVocabulary v = gpt2_vocabulary(testing::repo_data_dir() + "/gpt2");
  ASSERT_EQ(v.tokens.size(), 50257u);
  EXPECT_EQ(v.eos, 50256);
  const auto json = from_json(tokenizer_json(v), d.path() / "json");
  const auto gguf = from_gguf(v, d.path() / "gpt2.gguf");
  for (const auto& [name, text] : corpus()) {
    SCOPED_TRACE("case " + name);
    EXPECT_EQ(json->encode(text), testing::gpt2().encode(text));
    EXPECT_EQ(gguf->encode(text), testing::gpt2().encode(text));
  }
}

// tokenizer.json -> GGUF keys -> loom's GGUF reader: the ids of the tokenizer.json, less what the
// notes say GGUF cannot carry (the test strips that from the original before comparing).
TEST(TokenizerExport, TokenizerJsonToGgufKeepsTheIds) {
  for (const char* style : {"llama3", "qwen2", "smollm2_style"}) {
    SCOPED_TRACE(style);
    ScratchDir d;
    const std::filesystem::path src = kGolden / style;
    const std::string config =
        std::filesystem::exists(src / "tokenizer_config.json") ? read_bytes(src / "tokenizer_config.json") : "";
    const ByteLevelVocabulary v =
        vocabulary_from_tokenizer_json(read_bytes(src / "tokenizer.json"), config, (src / "tokenizer.json").string());
    nlohmann::json j = nlohmann::json::parse(read_bytes(src / "tokenizer.json"));
    j["normalizer"] = nullptr;  // NFC (qwen2): noted, not carried
    for (auto& a : j["added_tokens"]) a["lstrip"] = a["rstrip"] = a["single_word"] = false;  // noted, not carried
    for (auto& a : j["added_tokens"]) a["normalized"] = false;
    const auto want = from_json(j.dump(), d.path() / "want", config);
    const auto gguf = from_gguf(v, d.path() / "style.gguf");
    expect_same_ids(*want, *gguf);
    // And back: the GGUF's tokenizer as the Hugging Face files an export writes.
    const ExportedTokenizer files = hf_tokenizer_files((d.path() / "style.gguf").string(), {}, 5000, 64);
    ASSERT_EQ(files.files.size(), 3u);
    const auto again = from_json(files.files[0].bytes, d.path() / "again", files.files[1].bytes);
    expect_same_ids(*gguf, *again);
  }
  const ByteLevelVocabulary q = vocabulary_from_tokenizer_json(read_bytes(kGolden / "qwen2/tokenizer.json"), "", "q");
  ASSERT_EQ(q.notes.size(), 1u);
  EXPECT_EQ(q.notes[0], "the NFC normalizer is not carried (GGUF has none; llama.cpp and loom's GGUF reader skip it)");
  EXPECT_EQ(gguf_pre_name(q.pre), std::string("qwen2"));
}

TEST(TokenizerExport, SmolLM2GgufAsTokenizerJsonMatchesTokenizers) {
  const char* env = std::getenv("LOOM_TEST_MODEL");
  const std::string path = env && *env ? env
                                       : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") +
                                             "/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "SmolLM2 GGUF not found at " << path << ": run scripts/fetch-test-model.sh";
  ScratchDir d;
  const ByteLevelVocabulary v = vocabulary_from_gguf(io::GgufFile::open(path));
  EXPECT_EQ(gguf_pre_name(v.pre), std::string("smollm"));
  const auto tok = from_json(tokenizer_json(v), d.path() / "smollm2");
  const nlohmann::json golden = nlohmann::json::parse(read_bytes(kGolden / "smollm2_gguf/ids.json"));
  for (const auto& c : nlohmann::json::parse(read_bytes(kGolden / "corpus.json"))) {
    const std::string name = c.at("name").get<std::string>(), text = c.at("text").get<std::string>();
    SCOPED_TRACE("case " + name);
    EXPECT_EQ(tok->encode_special(text), golden.at(name).at("ids").get<std::vector<int32_t>>());
    EXPECT_EQ(tok->encode(text), golden.at(name).at("plain").get<std::vector<int32_t>>());
  }
}

TEST(TokenizerExport, FilesCarryTheChatTemplateAndEndIds) {
  const ChatCard card{"{{ messages[0]['content'] }}", "", "", {}};
  const ExportedTokenizer t = hf_tokenizer_files("gpt2", card, 50304, 1024);
  ASSERT_EQ(t.files.size(), 3u);
  EXPECT_EQ(t.files[1].name, "tokenizer_config.json");
  const nlohmann::json tc = nlohmann::json::parse(t.files[1].bytes);
  EXPECT_EQ(tc["chat_template"], card.chat_template);
  EXPECT_EQ(tc["eos_token"], "<|endoftext|>");
  EXPECT_EQ(tc["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(nlohmann::json::parse(t.files[2].bytes)["eos_token_id"], 50256);
  EXPECT_EQ(t.eos_id, 50256);
  // GGUF: padded to the model's vocabulary with unused tokens, the template inside.
  ScratchDir d;
  io::GgufWriter w;
  w.set("general.architecture", io::gguf_string("gpt2"));
  set_gguf_tokenizer("gpt2", card, 50304, w);
  w.write((d.path() / "t.gguf").string());
  const io::GgufFile g = io::GgufFile::open((d.path() / "t.gguf").string());
  EXPECT_EQ(g.get_strings("tokenizer.ggml.tokens").size(), 50304u);
  EXPECT_EQ(g.get_strings("tokenizer.ggml.tokens").back(), "[PAD50303]");
  EXPECT_EQ(g.get_ints("tokenizer.ggml.token_type").back(), 5);
  EXPECT_EQ(g.get_string("tokenizer.chat_template"), card.chat_template);
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "gpt-2");
}

TEST(TokenizerExport, RefusalsNameTheFix) {
  const std::string llama2 = (kGolden / "llama2/tokenizer.json").string();
  EXPECT_EQ(error_of([&] { vocabulary_from_tokenizer_json(read_bytes(llama2), "", "T"); }),
            "[export] T: a byte-fallback BPE (SentencePiece-style, as Llama 2's) has no GGUF form loom writes (it "
            "writes byte-level BPE); convert the original model with llama.cpp's convert_hf_to_gguf.py, or export "
            "--format hf");
  const std::string spm = std::string(LOOM_SOURCE_DIR) + "/tests/golden/gguf_spm/vocab.gguf";
  EXPECT_EQ(error_of([&] { vocabulary_from_gguf(io::GgufFile::open(spm)); }),
            "[export] " + spm +
                ": tokenizer.ggml.model 'llama' (SentencePiece-style) has no tokenizer.json form loom writes; export "
                "--format gguf keeps it as it is, or put the model's own tokenizer.json and tokenizer_config.json in "
                "the checkpoint");
  nlohmann::json j = nlohmann::json::parse(read_bytes(kGolden / "smollm2_style/tokenizer.json"));
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_EQ(error_of([&] { vocabulary_from_tokenizer_json(j.dump(), "", "T"); }),
            "[export] T: pre_tokenizer {\"type\":\"Whitespace\"} has no GGUF pre-tokenizer name loom writes (it writes "
            "GPT-2's ByteLevel, SmolLM's Digits + ByteLevel, and Llama 3's or Qwen2's Split + ByteLevel); export "
            "--format hf keeps the tokenizer as it is");
  ByteLevelVocabulary v = byte_vocabulary();
  EXPECT_EQ(error_of([&] { pad_vocabulary(v, 100); }),
            "[export] the tokenizer has 256 tokens but the model's vocabulary only 100; the checkpoint's tokenizer is "
            "not the one it was trained with");
}

}  // namespace
}  // namespace loom::data
