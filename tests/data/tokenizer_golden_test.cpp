// GPT-2 ids against the reference encoder: every case under tests/golden/tokenizer was
// produced by make_tokenizer_golden.py (OpenAI's algorithm with the `regex` module).
#include <gtest/gtest.h>

#include <sstream>

#include "data/data_testing.h"

namespace loom::data {
namespace {

using testing::gpt2;
using testing::read_bytes;

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/tokenizer";

std::vector<std::string> case_names() {
  std::istringstream in(read_bytes(kGolden / "CASES"));
  std::vector<std::string> names;
  for (std::string n; in >> n;) names.push_back(n);
  return names;
}

TEST(TokenizerGolden, EveryCaseMatchesReferenceIds) {
  const auto names = case_names();
  ASSERT_GE(names.size(), 20u) << "golden case list missing or short: " << kGolden / "CASES";
  for (const auto& name : names) {
    const std::string text = read_bytes(kGolden / (name + ".txt"));
    std::istringstream in(read_bytes(kGolden / (name + ".ids")));
    std::vector<int32_t> expected;
    for (int32_t id; in >> id;) expected.push_back(id);
    ASSERT_FALSE(text.empty()) << name;
    ASSERT_FALSE(expected.empty()) << name;
    const std::vector<int32_t> got = gpt2().encode(text);
    EXPECT_EQ(got, expected) << "case " << name;
    EXPECT_EQ(gpt2().decode(expected), text) << "case " << name;
  }
}

TEST(TokenizerGolden, WellKnownIds) {
  // Ids anyone can check against published GPT-2 examples.
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_id(), 50256);
  EXPECT_EQ(gpt2().merge_count(), 50000);
  EXPECT_EQ(gpt2().decode(std::vector<int32_t>{50256}), "<|endoftext|>");
}

}  // namespace
}  // namespace loom::data
