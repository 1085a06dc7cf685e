// jinja2's lexer for chat templates (trim_blocks=True, lstrip_blocks=True); see jinja_lexer.h.
#include "loom/data/jinja_lexer.h"

#include <cstring>

#include "loom/core/error.h"
#include "loom/data/jinja_text.h"
#include "loom/data/unicode.h"

namespace loom::data::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// jinja2 reads source as lines: "\r\n" and "\r" become "\n", and one trailing newline is dropped
// (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] == '\r') {
      out += '\n';
      if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
    } else {
      out += src[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : src_(normalize_newlines(source)), name_(name) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // the previous tag's match ended with a newline (or none yet)
    while (pos < src_.size()) {
      const size_t start = next_tag(pos);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos));
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      const char kind = src_[start + 1];
      size_t p = start + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      const int text_lines = count_lines(text);
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the line start and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool only_ws = true;
          for (size_t k = l_pos; k < text.size(); ++k) only_ws = only_ws && is_ws(text[k]);
          if (only_ws) text.resize(l_pos);
        }
      }
      emit_text(std::move(text));
      line_ += text_lines;
      pos = kind == '#' ? lex_comment(p, start) : lex_tag(p, kind == '{', start);
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenKind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(int line, const std::string& what) { fail("chat-template", name_, ":", line, ": ", what); }

  size_t next_tag(size_t pos) const {
    for (size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1))
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return std::string::npos;
  }

  static int count_lines(const std::string& s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
  }

  void emit_text(std::string text) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, std::move(text), line_});
  }

  // After a `-` closer all whitespace goes; after a plain block/comment closer, one newline
  // (trim_blocks). Returns the position after what was consumed.
  size_t after_close(size_t p, char sign, bool trims) {
    if (sign == '-') {
      while (p < src_.size() && is_ws(src_[p])) line_ += src_[p++] == '\n';
    } else if (sign != '+' && trims && p < src_.size() && src_[p] == '\n') {
      ++p, ++line_;
    }
    return p;
  }

  size_t lex_comment(size_t p, size_t start) {
    const int open_line = line_;
    const size_t end = src_.find("#}", p);
    if (end == std::string::npos) error(open_line, "comment '{#' is never closed with '#}'");
    (void)start;
    line_ += count_lines(src_.substr(p, end - p));
    const char sign = end > p && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    return after_close(end + 2, sign, true);
  }

  size_t lex_tag(size_t p, bool is_var, size_t start) {
    const int open_line = line_;
    tokens_.push_back({is_var ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", line_});
    std::string balance;
    const char* close = is_var ? "}}" : "%}";
    while (true) {
      while (p < src_.size() && is_ws(src_[p])) line_ += src_[p++] == '\n';
      if (p >= src_.size())
        error(open_line, std::string("tag '") + src_.substr(start, 2) + "' is never closed with '" + close + "'");
      if (balance.empty()) {
        char sign = 0;
        size_t q = p;
        if (src_[q] == '-' || src_[q] == '+') sign = src_[q++];
        if (src_.compare(q, 2, close) == 0 && !(is_var && sign == '+')) {
          tokens_.push_back({is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", line_});
          return after_close(q + 2, sign, !is_var);
        }
      }
      p = lex_token(p, balance);
    }
  }

  size_t lex_token(size_t p, std::string& balance) {
    const char c = src_[p];
    if (is_name_start(c)) {
      size_t q = p;
      while (q < src_.size() && (is_name_start(src_[q]) || is_digit(src_[q]))) ++q;
      tokens_.push_back({TokenKind::kName, src_.substr(p, q - p), line_});
      return q;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                       ">",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "=", ";"};
    for (const char* op : kOps) {
      const size_t len = std::strlen(op);
      if (src_.compare(p, len, op) != 0) continue;
      if (len == 1 && std::strchr("([{", c)) balance += c;
      if (len == 1 && std::strchr(")]}", c)) {
        const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (balance.empty() || balance.back() != want) error(line_, std::string("unexpected '") + c + "'");
        balance.pop_back();
      }
      tokens_.push_back({TokenKind::kOp, op, line_});
      return p + len;
    }
    error(line_, std::string("unexpected character '") + c + "' in a tag");
  }

  size_t digits(size_t p) const {
    while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1]))))
      ++p;
    return p;
  }

  size_t lex_number(size_t p) {
    size_t q = digits(p);
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) q = digits(q + 1), is_float = true;
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && is_digit(src_[r])) q = digits(r), is_float = true;
    }
    std::string text;
    for (size_t k = p; k < q; ++k)
      if (src_[k] != '_') text += src_[k];
    tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInt, text, line_});
    return q;
  }

  static int hex_value(char c) {
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's unicode-escape decoding of a literal's body; unknown escapes stay as written.
  size_t lex_string(size_t p) {
    const char quote = src_[p];
    const int open_line = line_;
    std::string out;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) error(open_line, "string literal is never closed");
      const char c = src_[q];
      if (c == quote) break;
      line_ += c == '\n';
      if (c != '\\' || q + 1 >= src_.size()) {
        out += c, ++q;
        continue;
      }
      const char e = src_[q + 1];
      q += 2;
      switch (e) {
        case '\n': ++line_; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = q + size_t(k) < src_.size() ? hex_value(src_[q + size_t(k)]) : -1;
            if (h < 0) error(line_, std::string("truncated \\") + e + " escape in a string literal");
            cp = cp * 16 + uint32_t(h);
          }
          if (cp > 0x10FFFF) error(line_, "escape beyond U+10FFFF in a string literal");
          append_utf8(out, cp);
          q += size_t(n);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++k)
              cp = cp * 8 + uint32_t(src_[q++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';
            out += e;
            line_ += e == '\n';
          }
      }
    }
    tokens_.push_back({TokenKind::kString, std::move(out), open_line});
    return q + 1;
  }

  std::string src_;
  const std::string& name_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name) { return Lexer(source, name).run(); }

}  // namespace loom::data::jinja
