// Hand-written matchers for the known Split regexes, and the pre-tokenizer steps. Each branch
// of the Llama 3 matcher names the alternative of the regex it stands for and why the regex's
// backtracking cannot pick another end (alternatives are tried in order at each position).
#include "loom/data/pretokenizers.h"

#include "loom/core/error.h"
#include "loom/data/pretokenize.h"
#include "loom/data/unicode.h"

namespace loom::data {
namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Cursor {
  const unsigned char* base;
  const unsigned char* end;
  size_t n;
  Utf8Char at(size_t i) const { return next_char(base + i, end); }
  bool is_crlf(size_t i) const { return base[i] == '\r' || base[i] == '\n'; }
};

// Length of a case-insensitive contraction at p ('s 't 're 've 'm 'll 'd), or 0. Under Unicode
// case folding U+017F (long s) matches 's' too.
size_t contraction_length_ci(const unsigned char* p, size_t avail) {
  if (avail < 2 || p[0] != '\'') return 0;
  auto lower = [](unsigned char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : char(c); };
  const char c1 = lower(p[1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (avail >= 3 && p[1] == 0xC5 && p[2] == 0xBF) return 3;  // 'ſ
  if (avail < 3) return 0;
  const char c2 = lower(p[2]);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

size_t run_end(const Cursor& c, size_t i, CharClass cls) {
  while (i < c.n) {
    const Utf8Char d = c.at(i);
    if (d.cls != cls) break;
    i += size_t(d.len);
  }
  return i;
}

size_t llama3_match_end(std::string_view text, size_t pos, int max_digits) {
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  const Cursor c{base, base + text.size(), text.size()};
  if (size_t len = contraction_length_ci(base + pos, c.n - pos)) return pos + len;  // (?i:'s|...)
  const Utf8Char c0 = c.at(pos);
  const size_t after0 = pos + size_t(c0.len);
  // [^\r\n\p{L}\p{N}]?\p{L}+: a letter run, or one non-letter/number/CR/LF character before one.
  if (c0.cls == CharClass::kLetter) return run_end(c, after0, CharClass::kLetter);
  if (c0.cls != CharClass::kNumber && !c.is_crlf(pos) && after0 < c.n && c.at(after0).cls == CharClass::kLetter)
    return run_end(c, after0, CharClass::kLetter);
  // \p{N}{1,3} (or \p{N}): greedy up to the limit.
  if (c0.cls == CharClass::kNumber) {
    size_t i = after0;
    for (int k = 1; k < max_digits && i < c.n; ++k) {
      const Utf8Char d = c.at(i);
      if (d.cls != CharClass::kNumber) break;
      i += size_t(d.len);
    }
    return i;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*: both runs greedy; neither can make the match fail later.
  size_t j = pos;
  if (base[pos] == ' ' && after0 < c.n && c.at(after0).cls == CharClass::kOther) j = after0;
  if (c.at(j).cls == CharClass::kOther) {
    size_t i = run_end(c, j, CharClass::kOther);
    while (i < c.n && c.is_crlf(i)) ++i;
    return i;
  }
  // c0 is whitespace. \s*[\r\n]+: \s* backs off to the last CR or LF of the run.
  size_t i = pos, last_crlf = std::string_view::npos, last_start = pos;
  while (i < c.n) {
    const Utf8Char d = c.at(i);
    if (d.cls != CharClass::kSpace) break;
    if (c.is_crlf(i)) last_crlf = i;
    last_start = i;
    i += size_t(d.len);
  }
  if (last_crlf != std::string_view::npos) return last_crlf + 1;
  // \s+(?!\S): the run if it ends the text, else the run less its last character; \s+ for a
  // lone whitespace character before a non-space.
  if (i == c.n || last_start == pos) return i;
  return last_start;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  explicit SplitPreTokenizer(SplitRegex r) : r_(r) {}
  void split(std::string_view text, bool, std::vector<std::string_view>& out, PieceArena&) const override {
    if (r_ == SplitRegex::kGpt2) {
      Gpt2PreTokenizer pt(text);
      std::string_view piece;
      while (pt.next(&piece)) out.push_back(piece);
      return;
    }
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = split_regex_match_end(r_, text, pos);
      out.push_back(text.substr(pos, end - pos));
      pos = end;
    }
  }

 private:
  SplitRegex r_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void split(std::string_view text, bool, std::vector<std::string_view>& out, PieceArena&) const override {
    const auto* base = reinterpret_cast<const unsigned char*>(text.data());
    const unsigned char* end = base + text.size();
    size_t start = 0, i = 0;
    bool in_digits = false;
    while (i < text.size()) {
      const Utf8Char d = next_char(base + i, end);
      const bool digit = d.cls == CharClass::kNumber;
      if (digit && individual_) {
        if (i > start) out.push_back(text.substr(start, i - start));
        out.push_back(text.substr(i, size_t(d.len)));
        start = i + size_t(d.len);
      } else if (i > start && digit != in_digits) {
        out.push_back(text.substr(start, i - start));
        start = i;
      }
      in_digits = digit;
      i += size_t(d.len);
    }
    if (start < text.size()) out.push_back(text.substr(start));
  }

 private:
  bool individual_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void split(std::string_view text, bool, std::vector<std::string_view>& out, PieceArena& arena) const override {
    if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
      std::string prefixed;
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      arena.push_back(std::move(prefixed));
      text = arena.back();
    }
    if (!use_regex_) {
      if (!text.empty()) out.push_back(text);
      return;
    }
    Gpt2PreTokenizer pt(text);
    std::string_view piece;
    while (pt.next(&piece)) out.push_back(piece);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_, use_regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void split(std::string_view text, bool at_start, std::vector<std::string_view>& out,
             PieceArena& arena) const override {
    if (text.empty()) return;
    std::string s;
    s.reserve(text.size() + rep_.size());
    for (char ch : text) {
      if (ch == ' ') {
        s += rep_;
      } else {
        s.push_back(ch);
      }
    }
    const bool prepend = scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_start);
    if (prepend && s.compare(0, rep_.size(), rep_) != 0) s.insert(0, rep_);
    arena.push_back(std::move(s));
    const std::string_view all = arena.back();
    if (!split_) {
      out.push_back(all);
      return;
    }
    // MergedWithNext: every piece but perhaps the first starts with the replacement.
    size_t start = 0;
    for (size_t at = all.find(rep_, 1); at != std::string_view::npos; at = all.find(rep_, at + rep_.size())) {
      if (at > start) out.push_back(all.substr(start, at - start));
      start = at;
    }
    out.push_back(all.substr(start));
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::string_view text, bool at_start, std::vector<std::string_view>& out,
             PieceArena& arena) const override {
    std::vector<std::string_view> cur{text}, next;
    for (const auto& step : steps_) {
      next.clear();
      for (size_t i = 0; i < cur.size(); ++i) step->split(cur[i], at_start && i == 0, next, arena);
      cur.swap(next);
    }
    for (std::string_view p : cur)
      if (!p.empty()) out.push_back(p);
  }
  bool byte_level() const override { return !steps_.empty() && steps_.back()->byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::optional<SplitRegex> recognize_split_regex(std::string_view pattern) {
  if (pattern == kGpt2Pattern) return SplitRegex::kGpt2;
  if (pattern == kLlama3Pattern) return SplitRegex::kLlama3;
  if (pattern == kQwen2Pattern) return SplitRegex::kQwen2;
  return std::nullopt;
}

std::string_view split_regex_pattern(SplitRegex r) {
  switch (r) {
    case SplitRegex::kGpt2: return kGpt2Pattern;
    case SplitRegex::kLlama3: return kLlama3Pattern;
    case SplitRegex::kQwen2: return kQwen2Pattern;
  }
  fail("tokenizer", "unknown split regex");
}

size_t split_regex_match_end(SplitRegex r, std::string_view text, size_t pos) {
  switch (r) {
    case SplitRegex::kGpt2: {
      Gpt2PreTokenizer pt(text.substr(pos));
      std::string_view piece;
      pt.next(&piece);
      return pos + piece.size();
    }
    case SplitRegex::kLlama3: return llama3_match_end(text, pos, 3);
    case SplitRegex::kQwen2: return llama3_match_end(text, pos, 1);
  }
  fail("tokenizer", "unknown split regex");
}

std::unique_ptr<PreTokenizer> make_split_pretokenizer(SplitRegex r) { return std::make_unique<SplitPreTokenizer>(r); }
std::unique_ptr<PreTokenizer> make_digits_pretokenizer(bool individual) {
  return std::make_unique<DigitsPreTokenizer>(individual);
}
std::unique_ptr<PreTokenizer> make_byte_level_pretokenizer(bool add_prefix_space, bool use_regex) {
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, use_regex);
}
std::unique_ptr<PreTokenizer> make_metaspace_pretokenizer(std::string replacement, PrependScheme scheme, bool split) {
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme, split);
}
std::unique_ptr<PreTokenizer> make_sequence_pretokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) {
  return std::make_unique<SequencePreTokenizer>(std::move(steps));
}

}  // namespace loom::data
