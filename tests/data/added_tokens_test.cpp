// AddedTokenMatcher's two orders where added tokens overlap in the text: tokenizers'
// leftmost-longest and llama.cpp's longest-token-first.
#include <gtest/gtest.h>

#include "loom/data/added_tokens.h"

namespace loom::data {
namespace {

// The pieces of `text` as "text" and "[id]".
std::vector<std::string> cut(const AddedTokenMatcher& m, std::string_view text, bool with_special) {
  std::vector<std::string> out;
  m.split(text, with_special, [&](std::string_view piece, std::optional<int32_t> id) {
    out.push_back(id ? "[" + std::to_string(*id) + "]" : std::string(piece));
  });
  return out;
}

AddedTokenMatcher matcher(AddedTokenOrder order) {
  std::vector<AddedToken> tokens(3);
  tokens[0].content = "e<|", tokens[0].id = 7;  // user-defined: split out even without specials
  tokens[1].content = "<|im_end|>", tokens[1].id = 8, tokens[1].special = true;
  tokens[2].content = "ab", tokens[2].id = 9;
  std::vector<std::string> text;
  for (const AddedToken& t : tokens) text.push_back(t.content);
  return AddedTokenMatcher(tokens, text, order);
}

TEST(AddedTokens, LongestFirstCutsAsLlamaCpp) {
  const auto leftmost = matcher(AddedTokenOrder::kLeftmostLongest);
  const auto longest = matcher(AddedTokenOrder::kLongestFirst);
  using V = std::vector<std::string>;
  EXPECT_EQ(cut(leftmost, "there<|im_end|>x", true), (V{"ther", "[7]", "im_end|>x"}));
  EXPECT_EQ(cut(longest, "there<|im_end|>x", true), (V{"there", "[8]", "x"}));
  // Without specials the control token cuts nothing and both orders agree.
  EXPECT_EQ(cut(longest, "there<|im_end|>x", false), (V{"ther", "[7]", "im_end|>x"}));
  // Every non-overlapping occurrence, left to right, in each piece a longer token left.
  EXPECT_EQ(cut(longest, "aabab<|im_end|>abab", true), (V{"a", "[9]", "[9]", "[8]", "[9]", "[9]"}));
  EXPECT_EQ(cut(longest, "aaa", true), (V{"aaa"}));
  EXPECT_TRUE(cut(longest, "", true).empty());
}

}  // namespace
}  // namespace loom::data
