// GPT-2's pre-tokeniser, written out by hand instead of run through a regex engine:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// It cuts text into the words that BPE then merges within. Ill-formed UTF-8 bytes count as
// one-byte characters that are neither letter, number nor space (see unicode.h).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class Gpt2PreTokenizer {
 public:
  explicit Gpt2PreTokenizer(std::string_view text) : text_(text) {}
  // Sets *piece to the next pre-token and returns true, or returns false at the end.
  bool next(std::string_view* piece);
  // Bytes consumed so far.
  size_t position() const { return pos_; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

// All pre-tokens of text, in order; they concatenate back to text.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace loom::data
