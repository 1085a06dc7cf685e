// UTF-8 decoding and the three character classes GPT-2's pre-tokeniser regex distinguishes
// (\p{L}, \p{N}, \s, everything else). Ill-formed bytes are not an error: each one becomes a
// one-byte character of class kOther, so every byte string has exactly one segmentation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::data {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

struct CharRange {
  uint32_t first, last;  // inclusive code points
  CharClass cls;
};

namespace unicode_detail {
extern const CharRange kRanges[];  // sorted, disjoint; generated into unicode_tables.cpp
extern const int kNumRanges;
extern const CharClass kAscii[128];  // classes of code points 0..127
}  // namespace unicode_detail

// Class of a Unicode scalar value as the PyPI `regex` module sees it.
CharClass classify(uint32_t cp);

// One character of a byte string: its length in bytes (1..4) and class.
struct Utf8Char {
  int len;
  CharClass cls;
};

// Appends code point cp (at most U+10FFFF) encoded as UTF-8.
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Length of the well-formed UTF-8 sequence (Unicode Table 3-7) starting at p, or 0 when the
// byte at p does not start one (then it is an ill-formed byte standing alone). Needs p < end.
inline int utf8_sequence_length(const unsigned char* p, const unsigned char* end, uint32_t* cp) {
  const unsigned b0 = p[0];
  const ptrdiff_t avail = end - p;
  auto cont = [](unsigned b) { return (b & 0xC0u) == 0x80u; };
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (avail < 2 || !cont(p[1])) return 0;
    *cp = ((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (avail < 3) return 0;
    const unsigned b1 = p[1];
    const unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (b1 < lo || b1 > hi || !cont(p[2])) return 0;
    *cp = ((b0 & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (avail < 4) return 0;
    const unsigned b1 = p[1];
    const unsigned lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (b1 < lo || b1 > hi || !cont(p[2]) || !cont(p[3])) return 0;
    *cp = ((b0 & 0x07u) << 18) | ((b1 & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    return 4;
  }
  return 0;
}

// The character at p (p < end): ASCII goes through a table, the rest through the ranges.
Utf8Char next_char(const unsigned char* p, const unsigned char* end);

// Fraction of bytes in [p, end) that are NUL/control bytes (other than \t \n \v \f \r and
// ESC) or ill-formed UTF-8: the "this is not text" measure used by `loom prepare`.
double garbage_fraction(const unsigned char* p, const unsigned char* end);

}  // namespace loom::data
