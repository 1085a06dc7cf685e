// tokenizer.json tokenizers against Hugging Face `tokenizers`: the golden ids under
// tests/golden/hf_tokenizers/ (made by its make_golden.py) for a Llama 3, Qwen2, Llama 2 and
// SmolLM2 style tokenizer, the interface a chat server uses, NFC, and what is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "data/data_testing.h"
#include "loom/data/hf_tokenizer.h"
#include "loom/data/normalizers.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/hf_tokenizers";

struct Case {
  std::string name, text;
};

std::vector<Case> corpus() {
  std::vector<Case> out;
  for (const auto& c : nlohmann::json::parse(read_bytes(kGolden / "corpus.json")))
    out.push_back({c.at("name").get<std::string>(), c.at("text").get<std::string>()});
  return out;
}

// Ids as `tokenizers` gives them with add_special_tokens=True.
std::vector<int32_t> with_post_processor(const Tokenizer& tok, std::vector<int32_t> ids) {
  if (tok.add_bos()) ids.insert(ids.begin(), *tok.bos_id());
  if (tok.add_eos()) ids.push_back(*tok.eos_id());
  return ids;
}

std::string nfc(std::string_view s) {
  std::string out;
  nfc_append(s, out);
  return out;
}

// Compares every corpus case; returns how many decoded back to their input (in NFC when the
// tokenizer normalizes to NFC).
int check_golden(const Tokenizer& tok, const std::filesystem::path& ids_file, bool normalizes_nfc = false) {
  const auto cases = corpus();
  EXPECT_GE(cases.size(), 35u);
  const nlohmann::json golden = nlohmann::json::parse(read_bytes(ids_file));
  int round_trips = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("case " + c.name);
    const nlohmann::json& g = golden.at(c.name);
    const auto expected = g.at("ids").get<std::vector<int32_t>>();
    const auto got = with_post_processor(tok, tok.encode_special(c.text));
    EXPECT_EQ(got, expected);
    EXPECT_EQ(tok.encode(c.text), g.at("plain").get<std::vector<int32_t>>());
    const std::string decoded = g.at("decoded").get<std::string>();
    if (decoded.find("\xEF\xBF\xBD") == std::string::npos) {
      EXPECT_EQ(tok.decode_skip_special(expected), decoded);
    }
    if (tok.decode(tok.encode(c.text)) == (normalizes_nfc ? nfc(c.text) : c.text)) {
      ++round_trips;
    } else {
      std::printf("  %s: does not decode back to its input\n", c.name.c_str());
    }
  }
  return round_trips;
}

std::unique_ptr<Tokenizer> load(const std::string& style) { return make_tokenizer((kGolden / style).string()); }

TEST(HfTokenizerGolden, Llama3StyleMatchesTokenizers) {
  auto tok = load("llama3/tokenizer.json");
  EXPECT_EQ(check_golden(*tok, kGolden / "llama3/ids.json"), int(corpus().size()));  // byte-level: every case
}

TEST(HfTokenizerGolden, Qwen2StyleMatchesTokenizers) {
  auto tok = load("qwen2");
  EXPECT_EQ(check_golden(*tok, kGolden / "qwen2/ids.json", true), int(corpus().size()));
}

TEST(HfTokenizerGolden, Llama2StyleMatchesTokenizers) {
  auto tok = load("llama2");
  EXPECT_EQ(check_golden(*tok, kGolden / "llama2/ids.json"), int(corpus().size()));  // byte fallback: every case
}

TEST(HfTokenizerGolden, SmolLM2StyleMatchesTokenizers) {
  auto tok = load("smollm2_style");
  EXPECT_EQ(check_golden(*tok, kGolden / "smollm2_style/ids.json"), int(corpus().size()));
}

TEST(HfTokenizer, ChatServerInterface) {
  auto qwen = load("qwen2");
  const int32_t im_start = *qwen->token_id("<|im_start|>"), im_end = *qwen->token_id("<|im_end|>");
  EXPECT_EQ(qwen->eos_id(), im_end);  // from tokenizer_config.json
  EXPECT_FALSE(qwen->add_bos());
  EXPECT_TRUE(qwen->is_special(im_start));
  EXPECT_FALSE(qwen->is_special(*qwen->token_id("<tool_call>")));  // added, not special
  EXPECT_EQ(qwen->token_text(im_end), "<|im_end|>");
  const auto ids = qwen->encode_special("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids.back(), im_end);
  EXPECT_EQ(qwen->decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(qwen->decode_skip_special(ids), "user\nhi");
  EXPECT_NE(qwen->encode("<|im_start|>").size(), 1u);  // plain encode reads it as text

  auto llama3 = load("llama3");
  EXPECT_TRUE(llama3->add_bos());
  EXPECT_EQ(llama3->bos_id(), llama3->token_id("<|begin_of_text|>"));
  EXPECT_EQ(llama3->token_text(*llama3->token_id("ĠHamlet")), "ĠHamlet");
  EXPECT_EQ(llama3->encode(" Hamlet"), std::vector<int32_t>{*llama3->token_id("ĠHamlet")});  // ignore_merges
  EXPECT_NE(error_of([&] { llama3->decode(std::vector<int32_t>{llama3->vocab_size()}); }).find("outside"),
            std::string::npos);

  auto llama2 = load("llama2");
  EXPECT_TRUE(llama2->add_bos());
  EXPECT_EQ(llama2->token_text(*llama2->bos_id()), "<s>");
  EXPECT_EQ(llama2->decode_skip_special(llama2->encode(" two  spaces")), " two  spaces");
}

TEST(HfTokenizer, LongWordsAreNotQuadratic) {
  auto llama2 = load("llama2");  // no pre-tokenizer: the whole text is one BPE word
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "abcdefghij"[i % 10];
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = llama2->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(llama2->decode(ids), text);
  EXPECT_LT(s, 1.0) << "200 KB word took " << s << " s";
}

TEST(Nfc, ComposesReordersAndLeavesNfcAlone) {
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                                 // e + acute -> é
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // Hangul L V T -> 각
  EXPECT_EQ(nfc("a\xCC\xA3\xCC\x82"), nfc("a\xCC\x82\xCC\xA3"));           // marks reordered by class
  EXPECT_EQ(nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");              // U+0958 is excluded: stays apart
  EXPECT_EQ(nfc("plain ascii \xFF bytes"), "plain ascii \xFF bytes");
}

TEST(HfTokenizer, RefusesWhatItCannotRunExactly) {
  ScratchDir dir;
  nlohmann::json j = nlohmann::json::parse(read_bytes(kGolden / "smollm2_style/tokenizer.json"));
  auto refusal = [&](const nlohmann::json& edited) {
    write_bytes(dir / "tokenizer.json", edited.dump());
    return error_of([&] { make_tokenizer((dir / "tokenizer.json").string()); });
  };
  nlohmann::json bad = j;
  bad["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(refusal(bad).find("pre_tokenizer type 'Whitespace' is not supported"), std::string::npos) << refusal(bad);
  bad = j;
  bad["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_NE(refusal(bad).find("Split pattern '\\w+' is not supported"), std::string::npos) << refusal(bad);
  bad = j;
  bad["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(refusal(bad).find("normalizer type 'NFKC' is not supported"), std::string::npos) << refusal(bad);
  bad = j;
  bad["model"]["type"] = "Unigram";
  EXPECT_NE(refusal(bad).find("model type 'Unigram' is not supported"), std::string::npos) << refusal(bad);
  bad = j;
  bad["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(refusal(bad).find("decoder type 'WordPiece' is not supported"), std::string::npos) << refusal(bad);
  EXPECT_NE(error_of([] { make_tokenizer("/nonexistent/tokenizer"); }).find("unknown tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace loom::data
