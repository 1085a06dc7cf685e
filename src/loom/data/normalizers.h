// Normalizers of Hugging Face `tokenizers` that loom runs: NFC (full canonical composition
// over tables generated from Unicode data, nfc_tables.cpp), Prepend, Replace of a literal
// string, and a sequence of those. Ill-formed UTF-8 bytes pass through NFC unchanged.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

namespace nfc_detail {
struct CombiningRange {
  uint32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  uint32_t cp, first, second;  // second 0: a singleton
};
struct Composition {
  uint32_t first, second, composite;  // sorted by (first, second)
};
extern const CombiningRange kCombining[];
extern const int kNumCombining;
extern const Decomposition kDecompositions[];
extern const int kNumDecompositions;
extern const Composition kCompositions[];
extern const int kNumCompositions;
}  // namespace nfc_detail

// Unicode Normalization Form C of `text` (UAX #15), appended to `out`.
void nfc_append(std::string_view text, std::string& out);

struct NormalizerStep {
  enum class Kind { kNfc, kPrepend, kReplace };
  Kind kind = Kind::kNfc;
  std::string pattern;  // kReplace: the literal to find
  std::string content;  // kPrepend: the prefix; kReplace: the replacement
};

// `text` with every non-overlapping occurrence of `from` (left to right) replaced by `to`;
// an empty `from` replaces nothing.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

// The steps in order. Prepend applies only to non-empty text, as in `tokenizers`.
class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}
  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace loom::data
