// The BPE model of Hugging Face `tokenizers` (and of llama.cpp's "gpt2" vocabularies): a
// vocabulary, merges applied lowest rank first, one occurrence at a time, byte-level or
// character symbols, byte fallback (<0xNN>) and an unknown token. It encodes one pre-token
// word; splitting text into words (normalizers, pre-tokenizers, added tokens) is the caller's.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

struct BpeOptions {
  // Symbols are bytes and vocabulary strings are GPT-2's byte alphabet (Ġ for space...);
  // otherwise symbols are UTF-8 characters matched against the vocabulary as written.
  bool byte_level = false;
  // A character missing from the vocabulary becomes its bytes' <0xNN> tokens.
  bool byte_fallback = false;
  // A word that is itself in the vocabulary is one token, whatever the merges say (Llama 3).
  bool ignore_merges = false;
  // Consecutive unknown characters become one unknown token.
  bool fuse_unk = false;
  // The unknown token's id; without one, symbols missing from the vocabulary are dropped.
  std::optional<int32_t> unk_id;
};

// GPT-2's printable stand-in for each byte, as UTF-8 ("Ġ" for 0x20).
const std::string& byte_level_char(uint8_t b);
// The raw bytes of a byte-alphabet string; false when a character is outside the alphabet.
bool byte_level_unmap(std::string_view s, std::string* out);

// "<0x0A>" for byte 10: the token byte fallback gives a byte (SentencePiece's byte pieces).
std::string byte_fallback_name(uint8_t b);
// The byte a "<0xNN>" token stands for (either case of hex digit), if `s` is one.
std::optional<uint8_t> byte_fallback_value(std::string_view s);

class BpeModel {
 public:
  // tokens[id] is the vocabulary string of id (holes are empty and never produced); merges are
  // (left, right) vocabulary strings in rank order. A merge naming a string missing from the
  // vocabulary is an error naming `where` (the file) and the merge.
  BpeModel(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, const std::string& where);
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;

  // Reused buffers of the merge loop; one per encoding thread.
  struct Scratch {
    struct Sym {
      int32_t id, prev, next;
      bool alive;
    };
    struct Cand {
      int32_t rank, pos, merged;
      // std::push_heap keeps the greatest on top; "greater" here is the lower (rank, pos).
      bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<Sym> syms;
    std::vector<Cand> heap;
    std::vector<int32_t> ids;
  };

  // Appends the ids of one word (raw bytes in byte-level mode, else text as the vocabulary
  // writes it). Results of short words are cached.
  void encode_word(std::string_view word, std::vector<int32_t>& out, Scratch& scratch) const;

  int32_t size() const { return int32_t(tokens_.size()); }
  const std::string& token(int32_t id) const { return tokens_[size_t(id)]; }
  // The id of a vocabulary string as written, if any.
  std::optional<int32_t> find(std::string_view token) const;
  const BpeOptions& options() const { return options_; }
  int64_t merge_count() const;

 private:
  struct Impl;
  std::vector<std::string> tokens_;
  BpeOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::data
