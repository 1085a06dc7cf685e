// Leftmost-longest matching as tokenizers' added_vocabulary.rs does it with an Aho-Corasick
// automaton: scan for the first position where any token matches, take the longest there,
// go on after it. A match discarded by single_word is not retried at a later start inside it.
// Longest-first matching cuts the text token by token, as llama.cpp does.
#include "loom/data/added_tokens.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/data/unicode.h"

namespace loom::data {
namespace {

bool is_word_char(const unsigned char* p, const unsigned char* end) {
  const Utf8Char c = next_char(p, end);
  return c.cls == CharClass::kLetter || c.cls == CharClass::kNumber || *p == '_';
}

// Start of the last character of [begin, end); ill-formed bytes count as one character.
const unsigned char* last_char(const unsigned char* begin, const unsigned char* end) {
  const unsigned char* p = end - 1;
  while (p > begin && (*p & 0xC0) == 0x80 && end - p < 4) --p;
  uint32_t cp = 0;
  if (utf8_sequence_length(p, end, &cp) != end - p) p = end - 1;
  return p;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> match_text,
                                     AddedTokenOrder order)
    : order_(order), tokens_(std::move(tokens)), match_(std::move(match_text)), by_first_byte_(256) {
  if (order_ == AddedTokenOrder::kLongestFirst) {
    for (const AddedToken& t : tokens_)
      LOOM_CHECK(!t.single_word && !t.lstrip && !t.rstrip, "tokenizer", "added token '", t.content,
                 "': single_word, lstrip and rstrip are not supported where tokens match longest first");
  }
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (!match_[i].empty()) by_first_byte_[uint8_t(match_[i][0])].push_back(int32_t(i));
  for (auto& list : by_first_byte_)
    std::stable_sort(list.begin(), list.end(),
                     [&](int32_t a, int32_t b) { return match_[size_t(a)].size() > match_[size_t(b)].size(); });
}

void AddedTokenMatcher::split(std::string_view text, bool with_special,
                              const std::function<void(std::string_view, std::optional<int32_t>)>& emit) const {
  if (order_ == AddedTokenOrder::kLongestFirst) {
    split_longest_first(text, with_special, emit);
    return;
  }
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* end = base + text.size();
  size_t done = 0;  // text before this is emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& cands = by_first_byte_[base[pos]];
    int32_t hit = -1;
    for (int32_t c : cands) {
      const std::string& m = match_[size_t(c)];
      if (text.compare(pos, m.size(), m) == 0) {
        hit = c;
        break;
      }
    }
    if (hit < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[size_t(hit)];
    size_t start = pos, stop = pos + match_[size_t(hit)].size();
    pos = stop;
    if (t.special && !with_special) continue;
    if (t.single_word) {
      const bool word_before = start > 0 && is_word_char(last_char(base, base + start), end);
      const bool word_after = stop < text.size() && is_word_char(base + stop, end);
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > done) {
        const unsigned char* p = last_char(base + done, base + s);
        if (next_char(p, end).cls != CharClass::kSpace) break;
        s = size_t(p - base);
      }
      start = s;
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        const Utf8Char c = next_char(base + stop, end);
        if (c.cls != CharClass::kSpace) break;
        stop += size_t(c.len);
      }
    }
    if (start > done) emit(text.substr(done, start - done), std::nullopt);
    emit(text.substr(start, stop - start), t.id);
    done = stop;
    pos = std::max(pos, stop);
  }
  if (done < text.size()) emit(text.substr(done), std::nullopt);
}

void AddedTokenMatcher::split_longest_first(
    std::string_view text, bool with_special,
    const std::function<void(std::string_view, std::optional<int32_t>)>& emit) const {
  // Only the tokens that occur somewhere in the text can cut it.
  std::vector<int32_t> present;
  std::vector<bool> seen(tokens_.size(), false);
  for (size_t pos = 0; pos < text.size(); ++pos) {
    for (int32_t c : by_first_byte_[uint8_t(text[pos])]) {
      if (seen[size_t(c)] || (tokens_[size_t(c)].special && !with_special)) continue;
      if (text.compare(pos, match_[size_t(c)].size(), match_[size_t(c)]) == 0) {
        seen[size_t(c)] = true;
        present.push_back(c);
      }
    }
  }
  std::sort(present.begin(), present.end(), [&](int32_t a, int32_t b) {
    const size_t la = match_[size_t(a)].size(), lb = match_[size_t(b)].size();
    return la != lb ? la > lb : a < b;
  });

  struct Piece {
    size_t begin, end;
    int32_t token;  // index into tokens_, or -1 for text
  };
  std::vector<Piece> pieces, next;
  if (!text.empty()) pieces.push_back({0, text.size(), -1});
  for (int32_t c : present) {
    const std::string& m = match_[size_t(c)];
    next.clear();
    for (const Piece& p : pieces) {
      if (p.token >= 0) {
        next.push_back(p);
        continue;
      }
      const std::string_view span = text.substr(0, p.end);
      size_t at = p.begin;
      for (size_t f = span.find(m, at); f != std::string_view::npos; f = span.find(m, at)) {
        if (f > at) next.push_back({at, f, -1});
        next.push_back({f, f + m.size(), c});
        at = f + m.size();
      }
      if (at < p.end) next.push_back({at, p.end, -1});
    }
    pieces.swap(next);
  }
  for (const Piece& p : pieces) {
    const std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (p.token < 0) {
      emit(piece, std::nullopt);
    } else {
      emit(piece, tokens_[size_t(p.token)].id);
    }
  }
}

}  // namespace loom::data
