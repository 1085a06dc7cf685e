// NFC by the book (UAX #15 sections 3 and 9): full canonical decomposition (Hangul by
// arithmetic), canonical ordering of combining marks, then canonical composition where no
// mark of equal or higher class blocks it. ASCII runs skip all of it.
#include "loom/data/normalizers.h"

#include <algorithm>

#include "loom/data/unicode.h"

namespace loom::data {
namespace {

using namespace nfc_detail;

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningRange* end = kCombining + kNumCombining;
  const CombiningRange* it =
      std::upper_bound(kCombining, end, cp, [](uint32_t c, const CombiningRange& r) { return c < r.first; });
  if (it == kCombining) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kNumDecompositions;
  const Decomposition* it =
      std::lower_bound(kDecompositions, end, cp, [](const Decomposition& d, uint32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kCompositions + kNumCompositions;
  const Composition* it = std::lower_bound(kCompositions, end, std::pair{a, b}, [](const Composition& c, auto key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

// NFC of a run of well-formed code points.
void nfc_run(std::vector<uint32_t>& cps, std::vector<uint32_t>& d, std::string& out) {
  d.clear();
  for (uint32_t cp : cps) decompose(cp, d);
  // Canonical ordering: a stable sort of each run of non-starters by class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + std::ptrdiff_t(i), d.begin() + std::ptrdiff_t(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Composition: `last_ccc` is the class of the last character kept after the starter; 256
  // stands for "no starter to compose with yet".
  std::vector<uint32_t> res;
  res.reserve(d.size());
  size_t starter = 0;
  int last_ccc = 256;
  for (uint32_t c : d) {
    const int ccc = combining_class(c);
    if (last_ccc != 256 && (last_ccc < ccc || (last_ccc == 0 && res.size() == starter + 1))) {
      if (uint32_t comp = compose_pair(res[starter], c)) {
        res[starter] = comp;
        continue;
      }
    }
    if (ccc == 0) {
      starter = res.size();
      last_ccc = 0;
    } else if (last_ccc != 256) {
      last_ccc = ccc;
    }
    res.push_back(c);
  }
  for (uint32_t cp : res) append_utf8(out, cp);
}

}  // namespace

void nfc_append(std::string_view text, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  std::vector<uint32_t> run, scratch;
  auto flush = [&] {
    if (!run.empty()) nfc_run(run, scratch, out);
    run.clear();
  };
  while (p < end) {
    if (*p < 0x80) {  // ASCII never composes with what precedes it, except as a starter itself
      if (p + 1 < end && p[1] >= 0x80) {
        flush();
        run.push_back(*p++);
        continue;
      }
      flush();
      out.push_back(char(*p++));
      continue;
    }
    uint32_t cp = 0;
    const int len = utf8_sequence_length(p, end, &cp);
    if (len == 0) {
      flush();
      out.push_back(char(*p++));
      continue;
    }
    run.push_back(cp);
    p += len;
  }
  flush();
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  size_t at = 0;
  for (size_t f = text.find(from); f != std::string_view::npos; f = text.find(from, at)) {
    out.append(text, at, f - at);
    out += to;
    at = f + from.size();
  }
  out.append(text, at);
  return out;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string cur(text), next;
  for (const NormalizerStep& s : steps_) {
    switch (s.kind) {
      case NormalizerStep::Kind::kNfc:
        next.clear();
        nfc_append(cur, next);
        cur.swap(next);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!cur.empty()) cur.insert(0, s.content);
        break;
      case NormalizerStep::Kind::kReplace: cur = replace_all(cur, s.pattern, s.content); break;
    }
  }
  return cur;
}

}  // namespace loom::data
