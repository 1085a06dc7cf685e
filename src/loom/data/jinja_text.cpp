// Python str semantics over UTF-8 bytes for the chat-template interpreter (see jinja_text.h).
#include "loom/data/jinja_text.h"

#include <cstdio>

namespace loom::data::jinja {

uint32_t decode_at(std::string_view s, size_t pos, int& len) {
  const auto c = static_cast<unsigned char>(s[pos]);
  int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || pos + n > s.size()) {
    len = 1;
    return c;
  }
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[pos + k]);
    if ((cc & 0xC0) != 0x80) {
      len = 1;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  len = n;
  return cp;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offs;
  offs.reserve(s.size() + 1);
  for (size_t p = 0; p < s.size();) {
    offs.push_back(p);
    int len = 1;
    decode_at(s, p, len);
    p += size_t(len);
  }
  offs.push_back(s.size());
  return offs;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_py_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {
// Byte range [b, e) of `s` left after dropping code points that `drop` accepts at the chosen ends.
template <class Pred>
std::string strip_if(std::string_view s, bool left, bool right, Pred drop) {
  const auto offs = code_point_offsets(s);
  size_t b = 0, e = offs.size() - 1;  // code point indices
  int len = 0;
  if (left)
    while (b < e && drop(decode_at(s, offs[b], len))) ++b;
  if (right)
    while (e > b && drop(decode_at(s, offs[e - 1], len))) --e;
  return std::string(s.substr(offs[b], offs[e] - offs[b]));
}
}  // namespace

std::string py_strip(std::string_view s, bool left, bool right) { return strip_if(s, left, right, is_py_space); }

std::string py_strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  std::vector<uint32_t> set;
  for (size_t p = 0; p < chars.size();) {
    int len = 1;
    set.push_back(decode_at(chars, p, len));
    p += size_t(len);
  }
  return strip_if(s, left, right, [&](uint32_t cp) {
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  });
}

std::vector<std::string> py_split_ws(std::string_view s, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t p = 0;
  int len = 1;
  while (true) {
    while (p < s.size() && is_py_space(decode_at(s, p, len))) p += size_t(len);
    if (p >= s.size()) break;
    if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
      parts.push_back(py_strip(s.substr(p), false, true));
      break;
    }
    const size_t start = p;
    while (p < s.size() && !is_py_space(decode_at(s, p, len))) p += size_t(len);
    parts.emplace_back(s.substr(start, p - start));
  }
  return parts;
}

std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t p = 0;
  while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
    const size_t q = s.find(sep, p);
    if (q == std::string_view::npos) break;
    parts.emplace_back(s.substr(p, q - p));
    p = q + sep.size();
  }
  parts.emplace_back(s.substr(p));
  return parts;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` before every code point and at the end
    const auto offs = code_point_offsets(s);
    int64_t done = 0;
    auto put = [&] {
      if (count < 0 || done < count) out += to, ++done;
    };
    for (size_t k = 0; k + 1 < offs.size(); ++k) put(), out += s.substr(offs[k], offs[k + 1] - offs[k]);
    put();
    return out;
  }
  size_t p = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t q = s.find(from, p);
    if (q == std::string_view::npos) break;
    out += s.substr(p, q - p);
    out += to;
    p = q + from.size();
  }
  out += s.substr(p);
  return out;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = char(c - 32);
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return out;
}

namespace {
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// Python counts non-ASCII letters as cased too; a byte >= 0x80 is treated as part of a word.
bool word_byte(char c) { return ascii_alpha(c) || static_cast<unsigned char>(c) >= 0x80; }
}  // namespace

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (ascii_alpha(c)) c = prev_cased ? ascii_lower({&c, 1})[0] : ascii_upper({&c, 1})[0];
    prev_cased = word_byte(c);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = char(out[0] - 32);
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace loom::data::jinja
