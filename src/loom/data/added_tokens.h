// Added tokens (special tokens such as <|im_start|>, and user-added words) and how they are
// found in text before anything else runs: leftmost-longest as `tokenizers` does (with the
// single_word, lstrip and rstrip options), or longest token first as llama.cpp does. Encoding
// the text between them is the caller's.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;      // a control token: never printed, and plain encode treats it as text
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool single_word = false;  // matches only between non-word characters
  bool normalized = false;   // matched in normalized text instead of the raw input
};

// Which match wins where the texts of added tokens overlap in the input.
enum class AddedTokenOrder {
  // tokenizers' added_vocabulary.rs: scan left to right, at the first position where a token
  // matches take the longest there, go on after it.
  kLeftmostLongest,
  // llama.cpp's tokenizer_st_partition: the longest token (ties: the earlier in `tokens`) cuts
  // every remaining piece of text at its leftmost non-overlapping occurrences, then the next
  // longest cuts what is left. No single_word, lstrip or rstrip here.
  kLongestFirst,
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `tokens` are matched by `match_text` (content, or its normalized form), in the same order.
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> match_text,
                    AddedTokenOrder order = AddedTokenOrder::kLeftmostLongest);
  bool empty() const { return tokens_.empty(); }

  // Cuts `text` into pieces, in order: (piece, nullopt) for text to encode and
  // (matched span, id) for an added token. Special tokens are ignored unless `with_special`.
  void split(std::string_view text, bool with_special,
             const std::function<void(std::string_view piece, std::optional<int32_t> id)>& emit) const;

 private:
  void split_longest_first(std::string_view text, bool with_special,
                           const std::function<void(std::string_view, std::optional<int32_t>)>& emit) const;

  AddedTokenOrder order_ = AddedTokenOrder::kLeftmostLongest;
  std::vector<AddedToken> tokens_;
  std::vector<std::string> match_;
  std::vector<std::vector<int32_t>> by_first_byte_;  // token indices, longest match text first
};

}  // namespace loom::data
