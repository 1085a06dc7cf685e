// llama.cpp's SPM tokenizer (llama-vocab.cpp, llm_tokenizer_spm_session and detokenize),
// written from its behaviour: each piece of text between added tokens gets a leading space
// (add_space_prefix), spaces become U+2581, and, starting from characters, the adjacent pair
// whose concatenation is the highest-scoring piece merges first (ties: the leftmost pair).
// What is left unmerged and is not a piece falls back to byte tokens.
#include "loom/data/spm_tokenizer.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/normalizers.h"

namespace loom::data {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Bytes in the character a lead byte starts, from that byte alone (llama.cpp's
// unicode_len_utf8): an ill-formed sequence still spans 2-4 bytes, clipped at the end of text.
// unicode.h's utf8_sequence_length checks the continuation bytes; llama.cpp does not.
size_t lead_byte_length(uint8_t b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

// One symbol of the merge: a span of the escaped text, linked to its neighbours.
struct Symbol {
  uint32_t begin, len;
  int32_t prev, next;
  int32_t id;  // the piece a merge made; -1 for an unmerged character
};

struct Bigram {
  float score;
  int32_t left, right;
  uint32_t len;  // left.len + right.len when pushed: a later change to either makes it stale
  int32_t id;
  // std::push_heap keeps the greatest on top: the higher score, then the smaller left.
  bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
};

}  // namespace

SpmTokenizer::SpmTokenizer(SpmVocab vocab) : vocab_(std::move(vocab)) {
  const std::string& where = vocab_.name;
  const size_t n = vocab_.pieces.size();
  LOOM_CHECK(n > 0, "tokenizer", where, ": the vocabulary is empty");
  LOOM_CHECK(vocab_.scores.size() == n && vocab_.types.size() == n, "tokenizer", where, ": ", n, " pieces but ",
             vocab_.scores.size(), " scores and ", vocab_.types.size(), " token types; the file is corrupt");
  for (const auto& [key, id] : {std::pair{"bos", vocab_.bos}, {"eos", vocab_.eos}, {"unknown", vocab_.unk}}) {
    LOOM_CHECK(!id || (*id >= 0 && size_t(*id) < n), "tokenizer", where, ": the ", key, " id ", id.value_or(0),
               " is outside the vocabulary (0..", n - 1, ")");
  }
  id_of_.reserve(n);
  bytes_of_.resize(n);
  special_.assign(n, false);
  std::vector<AddedToken> added;
  std::vector<std::string> added_text;
  for (size_t id = 0; id < n; ++id) {
    const std::string& piece = vocab_.pieces[id];
    LOOM_CHECK(!piece.empty(), "tokenizer", where, ": piece ", id, " is empty");
    const auto [it, fresh] = id_of_.emplace(piece, int32_t(id));
    LOOM_CHECK(fresh, "tokenizer", where, ": pieces ", it->second, " and ", id, " are both '", piece,
               "'; the file is corrupt");
    switch (vocab_.types[id]) {
      case GgufTokenType::kNormal: bytes_of_[id] = replace_all(piece, kSpaceMark, " "); break;
      case GgufTokenType::kByte: {
        const auto b = byte_fallback_value(piece);
        LOOM_CHECK(b.has_value(), "tokenizer", where, ": byte token ", id, " is '", piece,
                   "', not <0xNN>; the file is corrupt");
        bytes_of_[id] = std::string(1, char(*b));
        break;
      }
      case GgufTokenType::kControl:
      case GgufTokenType::kUnknown:
      case GgufTokenType::kUserDefined: {
        bytes_of_[id] = piece;  // as written: no "▁" to space
        AddedToken t;
        t.content = piece;
        t.id = int32_t(id);
        t.special = vocab_.types[id] != GgufTokenType::kUserDefined;
        special_[id] = t.special;
        added.push_back(std::move(t));
        added_text.push_back(piece);
        break;
      }
      case GgufTokenType::kUnused:
      case GgufTokenType::kUndefined: break;  // prints nothing
    }
  }
  matcher_ = AddedTokenMatcher(std::move(added), std::move(added_text), AddedTokenOrder::kLongestFirst);
  for (int b = 0; b < 256; ++b) {
    auto it = id_of_.find(byte_fallback_name(uint8_t(b)));
    const char raw = char(b);
    if (it == id_of_.end() && b != 0) it = id_of_.find(std::string_view(&raw, 1));  // llama.cpp's C string: no NUL
    byte_token_[b] = it != id_of_.end() ? it->second : vocab_.unk.value_or(-1);
  }
}

bool SpmTokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[size_t(id)]; }

std::string SpmTokenizer::token_text(int32_t id) const {
  LOOM_CHECK(id >= 0 && id < vocab_size(), "tokenizer", "id ", id, " is outside ", vocab_.name, "'s vocabulary (0..",
             vocab_size() - 1, ")");
  return vocab_.pieces[size_t(id)];
}

std::optional<int32_t> SpmTokenizer::token_id(const std::string& text) const {
  auto it = id_of_.find(text);
  if (it == id_of_.end()) return std::nullopt;
  return it->second;
}

void SpmTokenizer::encode_append(std::string_view bytes, std::vector<int32_t>& out) const {
  encode_impl(bytes, false, out);
}

void SpmTokenizer::encode_special_append(std::string_view text, std::vector<int32_t>& out) const {
  encode_impl(text, true, out);
}

void SpmTokenizer::encode_impl(std::string_view text, bool with_special, std::vector<int32_t>& out) const {
  bool after_token = true;  // the start of the text counts as following a token
  matcher_.split(text, with_special, [&](std::string_view piece, std::optional<int32_t> id) {
    if (id) {
      out.push_back(*id);
      after_token = true;
      return;
    }
    const std::string escaped =
        std::string(vocab_.add_space_prefix && after_token ? kSpaceMark : "") + replace_all(piece, " ", kSpaceMark);
    encode_escaped(escaped, out);
    after_token = false;
  });
}

void SpmTokenizer::encode_escaped(std::string_view text, std::vector<int32_t>& out) const {
  LOOM_CHECK(text.size() < (size_t(1) << 31), "tokenizer", vocab_.name, ": a run of ", text.size(),
             " bytes without added tokens is over the 2 GiB one merge can take; encode the text in parts");
  std::vector<Symbol> syms;
  for (size_t at = 0; at < text.size();) {
    const size_t len = std::min(lead_byte_length(uint8_t(text[at])), text.size() - at);
    const int32_t i = int32_t(syms.size());
    syms.push_back({uint32_t(at), uint32_t(len), i - 1, at + len < text.size() ? i + 1 : -1, -1});
    at += len;
  }
  std::vector<Bigram> heap;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t len = syms[size_t(left)].len + syms[size_t(right)].len;
    auto it = id_of_.find(text.substr(syms[size_t(left)].begin, len));
    if (it == id_of_.end()) return;
    heap.push_back({vocab_.scores[size_t(it->second)], left, right, len, it->second});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_pair(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Bigram top = heap.back();
    heap.pop_back();
    Symbol& left = syms[size_t(top.left)];
    Symbol& right = syms[size_t(top.right)];
    // Symbols only grow, and a symbol's right neighbour can only be merged into it, so a pair
    // is current exactly when both are alive and their lengths still add up.
    if (left.len == 0 || right.len == 0 || left.len + right.len != top.len) continue;
    left.len += right.len;
    left.id = top.id;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = top.left;
    try_pair(left.prev, top.left);
    try_pair(top.left, left.next);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[size_t(i)].next) {
    const Symbol& s = syms[size_t(i)];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    const std::string_view ch = text.substr(s.begin, s.len);
    if (auto it = id_of_.find(ch); it != id_of_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char c : ch) {
      const int32_t id = byte_token_[uint8_t(c)];
      LOOM_CHECK(id >= 0, "tokenizer", vocab_.name, ": text holds byte ", byte_fallback_name(uint8_t(c)),
                 ", which has no byte token or piece, and the vocabulary has no unknown token");
      out.push_back(id);
    }
  }
}

std::string SpmTokenizer::decode_impl(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    LOOM_CHECK(id >= 0 && id < vocab_size(), "tokenizer", "id ", id, " at position ", i, " is outside ", vocab_.name,
               "'s vocabulary (0..", vocab_size() - 1, ")");
    if (special_[size_t(id)] && !render_special) continue;
    std::string_view b = bytes_of_[size_t(id)];
    if (i == 0 && vocab_.add_space_prefix && !b.empty() && b[0] == ' ') b.remove_prefix(1);
    out += b;
  }
  return out;
}

std::string SpmTokenizer::decode(std::span<const int32_t> ids) const { return decode_impl(ids, true); }

std::string SpmTokenizer::decode_skip_special(std::span<const int32_t> ids) const { return decode_impl(ids, false); }

}  // namespace loom::data
