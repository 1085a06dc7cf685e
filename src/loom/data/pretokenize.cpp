// The alternatives of GPT-2's pattern are tried in the regex's order at each position; each
// branch below says which alternative it stands for and why backtracking cannot change it.
#include "loom/data/pretokenize.h"

#include "loom/data/unicode.h"

namespace loom::data {
namespace {

// Length of a contraction ('s 't 're 've 'm 'll 'd, lower case only, as in GPT-2) at p.
size_t contraction_length(const char* p, size_t avail) {
  if (avail < 2 || p[0] != '\'') return 0;
  const char c1 = p[1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (avail < 3) return 0;
  const char c2 = p[2];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

}  // namespace

bool Gpt2PreTokenizer::next(std::string_view* piece) {
  const size_t n = text_.size();
  if (pos_ >= n) return false;
  const auto* base = reinterpret_cast<const unsigned char*>(text_.data());
  const unsigned char* end = base + n;
  const size_t start = pos_;

  if (size_t len = contraction_length(text_.data() + start, n - start)) {
    pos_ = start + len;
    *piece = text_.substr(start, len);
    return true;
  }

  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional U+0020 then a run of one class.
  // The space is taken only when a non-space character follows it; otherwise every one of
  // these alternatives fails at a space and the whitespace rules below apply.
  size_t run = start;
  Utf8Char c = next_char(base + start, end);
  if (base[start] == ' ' && start + 1 < n) {
    Utf8Char after = next_char(base + start + 1, end);
    if (after.cls != CharClass::kSpace) {
      run = start + 1;
      c = after;
    }
  }
  if (c.cls != CharClass::kSpace) {
    const CharClass cls = c.cls;
    size_t i = run + size_t(c.len);
    while (i < n) {
      Utf8Char d = next_char(base + i, end);
      if (d.cls != cls) break;
      i += size_t(d.len);
    }
    pos_ = i;
    *piece = text_.substr(start, i - start);
    return true;
  }

  // `\s+(?!\S)` then `\s+`: the whole whitespace run if it ends the text; otherwise the run
  // minus its last character (which then leads the next word, e.g. " world"), unless the run
  // is a single character, which `\s+` takes alone.
  size_t i = start, last_start = start;
  while (i < n) {
    Utf8Char d = next_char(base + i, end);
    if (d.cls != CharClass::kSpace) break;
    last_start = i;
    i += size_t(d.len);
  }
  const size_t stop = (i < n && last_start > start) ? last_start : i;
  pos_ = stop;
  *piece = text_.substr(start, stop - start);
  return true;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  Gpt2PreTokenizer pt(text);
  std::string_view piece;
  while (pt.next(&piece)) out.push_back(piece);
  return out;
}

}  // namespace loom::data
