// BPE as Hugging Face `tokenizers` runs it (models/bpe): a heap of candidate merges ordered by
// (rank, position), popped one at a time, stale entries skipped, new neighbours pushed at once.
// That is O(n log n) in the word's length, so a 100k-character word (Llama 2 style tokenizers
// have no pre-tokenizer) is fine. A duplicated merge takes its last rank, as there.
#include "loom/data/bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "loom/core/error.h"
#include "loom/data/string_map.h"
#include "loom/data/unicode.h"

namespace loom::data {
namespace {

using IdMap = StringMap<int32_t>;

struct ByteAlphabet {
  std::string to_char[256];
  std::unordered_map<uint32_t, uint8_t> from_cp;
  ByteAlphabet() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
      append_utf8(to_char[b], cp);
      from_cp[cp] = uint8_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

constexpr size_t kMaxCachedWord = 128;
constexpr size_t kMaxCacheEntries = size_t(1) << 20;

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct PairHash {
  size_t operator()(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 16); }
};

}  // namespace

const std::string& byte_level_char(uint8_t b) { return alphabet().to_char[b]; }

bool byte_level_unmap(std::string_view s, std::string* out) {
  out->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  const auto& from = alphabet().from_cp;
  while (p < end) {
    uint32_t cp = 0;
    const int len = utf8_sequence_length(p, end, &cp);
    if (len == 0) return false;
    auto it = from.find(cp);
    if (it == from.end()) return false;
    out->push_back(char(it->second));
    p += len;
  }
  return true;
}

std::string byte_fallback_name(uint8_t b) {
  char name[8];
  std::snprintf(name, sizeof(name), "<0x%02X>", b);
  return name;
}

std::optional<uint8_t> byte_fallback_value(std::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>' || hex(s[3]) < 0 || hex(s[4]) < 0) return std::nullopt;
  return uint8_t(hex(s[3]) * 16 + hex(s[4]));
}

struct BpeModel::Impl {
  struct Merge {
    int32_t rank, merged;
  };
  IdMap by_text;    // vocabulary as written
  IdMap raw_bytes;  // byte-level mode: each token's raw bytes, what words are matched against
  // What words are matched against: the raw bytes in byte-level mode, else the vocabulary.
  const IdMap& by_key(bool byte_level) const { return byte_level ? raw_bytes : by_text; }
  int32_t byte_symbol[256];
  int32_t fallback[256];  // <0xNN>
  std::unordered_map<uint64_t, Merge, PairHash> merges;
  mutable std::mutex cache_mu;
  mutable StringMap<std::vector<int32_t>> cache;

  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges.find(pair_key(a, b));
    return it == merges.end() ? nullptr : &it->second;
  }
};

BpeModel::BpeModel(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& where)
    : tokens_(std::move(tokens)), options_(options), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.by_text.reserve(tokens_.size());
  std::string raw;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    if (t.empty()) continue;
    m.by_text.emplace(t, int32_t(id));
    if (options_.byte_level && byte_level_unmap(t, &raw)) m.raw_bytes.emplace(raw, int32_t(id));
  }
  for (int b = 0; b < 256; ++b) {
    m.byte_symbol[b] = -1;
    if (options_.byte_level) {
      if (auto it = m.by_text.find(byte_level_char(uint8_t(b))); it != m.by_text.end()) m.byte_symbol[b] = it->second;
    }
    auto it = m.by_text.find(byte_fallback_name(uint8_t(b)));
    m.fallback[b] = it == m.by_text.end() ? -1 : it->second;
  }
  if (options_.unk_id) {
    LOOM_CHECK(*options_.unk_id >= 0 && *options_.unk_id < int32_t(tokens_.size()), "tokenizer", where,
               ": the unknown token's id ", *options_.unk_id, " is outside the vocabulary (0..", tokens_.size() - 1,
               "); fix unk_token");
  }
  m.merges.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m.by_text.find(a), ib = m.by_text.find(b), im = m.by_text.find(a + b);
    LOOM_CHECK(ia != m.by_text.end() && ib != m.by_text.end() && im != m.by_text.end(), "tokenizer", where, ": merge ",
               rank, " '", a, " ", b,
               "' uses a token missing from the vocabulary; the file is corrupt or "
               "its merges belong to another vocabulary");
    m.merges.insert_or_assign(pair_key(ia->second, ib->second), Impl::Merge{int32_t(rank), im->second});
  }
}

BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;

int64_t BpeModel::merge_count() const { return int64_t(impl_->merges.size()); }

std::optional<int32_t> BpeModel::find(std::string_view token) const {
  auto it = impl_->by_text.find(token);
  if (it == impl_->by_text.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, Scratch& s) const {
  if (word.empty()) return;
  const Impl& m = *impl_;
  if (options_.ignore_merges) {
    const IdMap& keys = m.by_key(options_.byte_level);
    if (auto it = keys.find(word); it != keys.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWord;
  std::unique_lock<std::mutex> lock(m.cache_mu, std::defer_lock);
  if (cacheable && lock.try_lock()) {  // a busy cache is skipped rather than waited for
    if (auto it = m.cache.find(word); it != m.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    lock.unlock();
  }

  // Initial symbols, as models/bpe/model.rs merge_word builds them.
  s.ids.clear();
  int32_t pending_unk = -1;
  auto add_known = [&](int32_t id) {
    if (pending_unk >= 0) {
      s.ids.push_back(pending_unk);
      pending_unk = -1;
    }
    s.ids.push_back(id);
  };
  auto add_missing = [&](std::string_view piece) {
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : piece) all = all && m.fallback[uint8_t(c)] >= 0;
      if (all) {  // like the reference, a pending unknown token waits for the next known symbol
        for (char c : piece) s.ids.push_back(m.fallback[uint8_t(c)]);
        return;
      }
    }
    if (!options_.unk_id) return;
    if (pending_unk >= 0 && !options_.fuse_unk) s.ids.push_back(pending_unk);
    pending_unk = *options_.unk_id;
  };
  if (options_.byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      const int32_t id = m.byte_symbol[uint8_t(word[i])];
      if (id >= 0) {
        add_known(id);
      } else {
        add_missing(byte_level_char(uint8_t(word[i])));  // the symbol is the mapped character
      }
    }
  } else {
    const auto* base = reinterpret_cast<const unsigned char*>(word.data());
    const auto* end = base + word.size();
    for (const unsigned char* p = base; p < end;) {
      uint32_t cp = 0;
      const int len = std::max(1, utf8_sequence_length(p, end, &cp));
      const std::string_view ch(reinterpret_cast<const char*>(p), size_t(len));
      const IdMap& keys = m.by_key(options_.byte_level);
      if (auto it = keys.find(ch); it != keys.end()) {
        add_known(it->second);
      } else {
        add_missing(ch);
      }
      p += len;
    }
  }
  if (pending_unk >= 0) s.ids.push_back(pending_unk);

  // The merge loop of models/bpe/word.rs merge_all.
  const int32_t n = int32_t(s.ids.size());
  s.syms.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) s.syms[size_t(i)] = {s.ids[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1, true};
  s.heap.clear();
  auto push = [&](int32_t pos, int32_t a, int32_t b) {
    if (const Impl::Merge* mg = m.find_merge(a, b)) {
      s.heap.push_back({mg->rank, pos, mg->merged});
      std::push_heap(s.heap.begin(), s.heap.end());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, s.syms[size_t(i)].id, s.syms[size_t(i) + 1].id);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    const Scratch::Cand top = s.heap.back();
    s.heap.pop_back();
    Scratch::Sym& left = s.syms[size_t(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Scratch::Sym& right = s.syms[size_t(left.next)];
    const Impl::Merge* now = m.find_merge(left.id, right.id);
    if (now == nullptr || now->merged != top.merged) continue;  // stale entry
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) s.syms[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev, s.syms[size_t(left.prev)].id, left.id);
    if (left.next >= 0) push(top.pos, left.id, s.syms[size_t(left.next)].id);
  }
  const size_t first = out.size();
  for (int32_t i = 0; i < n; ++i)
    if (s.syms[size_t(i)].alive) out.push_back(s.syms[size_t(i)].id);

  if (cacheable && lock.try_lock()) {
    if (m.cache.size() >= kMaxCacheEntries) m.cache.clear();  // bound memory on huge corpora
    m.cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
  }
}

}  // namespace loom::data
