// Character classification over the generated range table, with an ASCII fast path, and
// the binary-garbage measure that `loom prepare` uses to refuse non-text input.
#include "loom/data/unicode.h"

namespace loom::data {

CharClass classify(uint32_t cp) {
  if (cp < 128) return unicode_detail::kAscii[cp];
  int lo = 0, hi = unicode_detail::kNumRanges - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    const CharRange& r = unicode_detail::kRanges[mid];
    if (cp < r.first)
      hi = mid - 1;
    else if (cp > r.last)
      lo = mid + 1;
    else
      return r.cls;
  }
  return CharClass::kOther;
}

Utf8Char next_char(const unsigned char* p, const unsigned char* end) {
  if (*p < 0x80) return {1, unicode_detail::kAscii[*p]};
  uint32_t cp = 0;
  const int len = utf8_sequence_length(p, end, &cp);
  if (len == 0) return {1, CharClass::kOther};
  return {len, classify(cp)};
}

double garbage_fraction(const unsigned char* p, const unsigned char* end) {
  if (p >= end) return 0.0;
  const ptrdiff_t total = end - p;
  ptrdiff_t bad = 0;
  while (p < end) {
    const unsigned b = *p;
    if (b < 0x80) {
      const bool allowed_control = (b >= '\t' && b <= '\r') || b == 0x1B;
      if ((b < 0x20 && !allowed_control) || b == 0x7F) ++bad;
      ++p;
      continue;
    }
    uint32_t cp = 0;
    const int len = utf8_sequence_length(p, end, &cp);
    if (len == 0) {
      ++bad;
      ++p;
    } else {
      p += len;
    }
  }
  return double(bad) / double(total);
}

}  // namespace loom::data
