// Pre-tokenizers of Hugging Face `tokenizers` that loom runs without a regex engine: Split with
// one of three known patterns (GPT-2's, Llama 3's, Qwen2's, matched by hand over unicode.h's
// classes), Digits, ByteLevel, Metaspace and Sequence. A Split with any other regex is refused
// where the tokenizer is loaded (hf_tokenizer.cpp); nothing here compiles a regex.
#pragma once
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// The regexes loom knows, by what they split:
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  kLlama3 with \p{N} (one digit) instead of \p{N}{1,3}
enum class SplitRegex { kGpt2, kLlama3, kQwen2 };

// The pattern a tokenizer.json Split names, when it is one of the above written exactly.
std::optional<SplitRegex> recognize_split_regex(std::string_view pattern);
// The pattern as those tokenizer.json files write it (what recognize_split_regex recognises).
std::string_view split_regex_pattern(SplitRegex r);

// End (byte offset) of the match of `r` that starts at `pos` < text.size(). The patterns match
// every non-empty remainder, so the pieces tile the text.
size_t split_regex_match_end(SplitRegex r, std::string_view text, size_t pos);

// Strings made by pre-tokenizers that rewrite text (Metaspace, a prefix space); pieces view
// them, so they must outlive the pieces. A deque keeps them in place as it grows.
using PieceArena = std::deque<std::string>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Appends the pieces of `text` to `out`, in order. `at_start`: text begins the input (for
  // Metaspace's prepend_scheme "first").
  virtual void split(std::string_view text, bool at_start, std::vector<std::string_view>& out,
                     PieceArena& arena) const = 0;
  // True when the pieces come out as raw bytes for a byte-level vocabulary (ByteLevel last).
  virtual bool byte_level() const { return false; }
};

std::unique_ptr<PreTokenizer> make_split_pretokenizer(SplitRegex r);
// individual: every digit alone; otherwise runs of digits (\p{N}) are kept together.
std::unique_ptr<PreTokenizer> make_digits_pretokenizer(bool individual);
// GPT-2's regex when use_regex; add_prefix_space prepends " " to a piece not starting with one.
std::unique_ptr<PreTokenizer> make_byte_level_pretokenizer(bool add_prefix_space, bool use_regex);
enum class PrependScheme { kAlways, kFirst, kNever };
// Spaces become `replacement`; it is prepended per `scheme`; with `split`, pieces start at
// each replacement character.
std::unique_ptr<PreTokenizer> make_metaspace_pretokenizer(std::string replacement, PrependScheme scheme, bool split);
std::unique_ptr<PreTokenizer> make_sequence_pretokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps);

}  // namespace loom::data
