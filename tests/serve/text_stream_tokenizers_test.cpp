// Streamed text against whole-sequence decoding for real tokenizers: a SentencePiece-style GGUF
// vocabulary (whose decoder drops the first token's leading space), Llama-2's tokenizer.json
// (Metaspace then Strip), and GPT-2's byte-level BPE, over the committed tokenizer corpus.
// Token by token, the text a TextStream returns must equal decode(all ids), or with a prompt,
// decode(prompt + ids) less decode(prompt).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "data/data_testing.h"
#include "loom/data/tokenizer.h"
#include "loom/serve/text_stream.h"

namespace loom::serve {
namespace {

const std::filesystem::path kSource = LOOM_SOURCE_DIR;

struct Case {
  std::string name, text;
};

const std::vector<Case>& corpus() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> out;
    for (const auto& c :
         nlohmann::json::parse(data::testing::read_bytes(kSource / "tests/golden/hf_tokenizers/corpus.json")))
      out.push_back({c.at("name").get<std::string>(), c.at("text").get<std::string>()});
    return out;
  }();
  return cases;
}

std::unique_ptr<DataTokenizer> tokenizer(const std::string& which) {
  if (which == "gguf_spm") return make_text_tokenizer((kSource / "tests/golden/gguf_spm/vocab.gguf").string());
  if (which == "hf_llama2")
    return make_text_tokenizer((kSource / "tests/golden/hf_tokenizers/llama2/tokenizer.json").string());
  return make_text_tokenizer("gpt2", data::testing::repo_data_dir());
}

// Everything a stream returns for `ids`, pushed one at a time, then finished.
std::string streamed(const TextTokenizer& tok, const std::vector<int32_t>& ids) {
  TextStream ts(tok, {});
  std::string out;
  for (int32_t id : ids) out += ts.push_token(id);
  out += ts.finish();
  EXPECT_EQ(out, ts.text());
  return out;
}

// The prompt as a server or `loom generate` sends it: BOS first where the model wants one.
std::vector<int32_t> with_bos(const DataTokenizer& tok, const std::string& text) {
  const data::Tokenizer& t = tok.tokenizer();
  std::vector<int32_t> ids;
  if (t.add_bos() && t.bos_id()) ids.push_back(*t.bos_id());
  t.encode_append(text, ids);
  return ids;
}

// A token whose bytes alone are not valid UTF-8: a character split across tokens.
bool splits_a_character(const DataTokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (Utf8Assembler().push(tok.token_bytes(id)) != tok.token_bytes(id)) return true;
  return false;
}

class StreamedText : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamedText, EqualsDecodingTheWholeSequence) {
  const auto tok = tokenizer(GetParam());
  const data::Tokenizer& t = tok->tokenizer();
  int compared = 0, split = 0;
  for (const Case& c : corpus()) {
    SCOPED_TRACE("case " + c.name);
    for (const auto& ids : {t.encode(c.text), with_bos(*tok, c.text)}) {
      const std::string whole = t.decode_skip_special(ids);
      EXPECT_EQ(streamed(*tok, ids), whole);
      split += splits_a_character(*tok, ids) ? 1 : 0;
      ++compared;
    }
  }
  EXPECT_GE(compared, 60);
  EXPECT_GE(split, 4) << "the corpus must split characters across tokens for this test to mean anything";
}

TEST_P(StreamedText, SkipsSpecialTokensAsWholeDecodingDoes) {
  const auto tok = tokenizer(GetParam());
  const data::Tokenizer& t = tok->tokenizer();
  // GPT-2's <|endoftext|> is text to it; the SentencePiece-style vocabularies' <s> and </s> are
  // control tokens that print nothing.
  const int32_t eos = *t.eos_id();
  EXPECT_EQ(t.is_special(eos), GetParam() != "gpt2");
  const std::vector<int32_t> more = t.encode("The end of it. And a new one");
  for (const Case& c : corpus()) {
    SCOPED_TRACE("case " + c.name);
    std::vector<int32_t> ids = with_bos(*tok, c.text);
    ids.push_back(eos);
    ids.insert(ids.end(), more.begin(), more.end());
    ids.push_back(eos);
    EXPECT_EQ(streamed(*tok, ids), t.decode_skip_special(ids));
  }
}

TEST_P(StreamedText, AContinuationReadsAsDecodingThePromptWithIt) {
  const auto tok = tokenizer(GetParam());
  const data::Tokenizer& t = tok->tokenizer();
  int compared = 0;
  for (const Case& c : corpus()) {
    SCOPED_TRACE("case " + c.name);
    const std::vector<int32_t> ids = with_bos(*tok, c.text);
    for (size_t cut : {size_t(1), ids.size() / 3, ids.size() / 2}) {
      if (cut == 0 || cut >= ids.size()) continue;
      const std::span<const int32_t> prompt(ids.data(), cut), reply(ids.data() + cut, ids.size() - cut);
      const std::string before = t.decode_skip_special(prompt), whole = t.decode_skip_special(ids);
      if (Utf8Assembler().push(before) != before) continue;  // a text prompt ends a character
      ASSERT_EQ(whole.compare(0, before.size(), before), 0);
      EXPECT_EQ(render_completion(*tok, {reply.begin(), reply.end()}, {}, nullptr, prompt),
                whole.substr(before.size()));
      ++compared;
    }
  }
  EXPECT_GE(compared, 60);
}

TEST_P(StreamedText, CutsAtStopStringsThatSpanWordBoundaries) {
  const auto tok = tokenizer(GetParam());
  const data::Tokenizer& t = tok->tokenizer();
  int stopped = 0;
  for (const Case& c : corpus()) {
    SCOPED_TRACE("case " + c.name);
    const std::vector<int32_t> ids = t.encode(c.text);
    const std::string whole = t.decode_skip_special(ids);
    // A stop string from the middle of the text that begins with a space, where decoding
    // token by token loses it.
    const size_t at = whole.find(' ', whole.size() / 3);
    if (at == std::string::npos || at + 8 > whole.size()) continue;
    std::string stop = whole.substr(at, 8);
    if (Utf8Assembler().push(stop) != stop) continue;  // not cut inside a character
    bool hit = false;
    EXPECT_EQ(render_completion(*tok, ids, {stop}, &hit), whole.substr(0, whole.find(stop)));
    EXPECT_TRUE(hit);
    ++stopped;
  }
  EXPECT_GE(stopped, 15);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, StreamedText, ::testing::Values("gguf_spm", "hf_llama2", "gpt2"));

}  // namespace
}  // namespace loom::serve
