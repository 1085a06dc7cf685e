// GPT-2 BPE: vocabulary loading, the merge loop and a per-word cache. The merge loop keeps
// the reference's semantics (repeatedly take the lowest-ranked adjacent pair and merge all of
// its occurrences left to right) but finds pairs with a heap over a linked list, so a long
// word (a run of 10k spaces) costs O(n log n) instead of O(n^2).
#include "loom/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "loom/core/error.h"
#include "loom/data/pretokenize.h"
#include "loom/data/string_map.h"

namespace loom::data {
namespace {

// GPT-2 stores token bytes as printable code points: bytes that are visible Latin-1 map to
// themselves, the other 68 to 256, 257, ... in byte order.
std::vector<int> unicode_to_byte_table() {
  std::vector<int> table(256 + 68, -1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[printable ? b : 256 + extra++] = b;
  }
  return table;
}

// Decodes one vocabulary string (UTF-8 of mapped code points) back to raw bytes.
bool unmap_token(const std::string& s, const std::vector<int>& table, std::string* out) {
  out->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    uint32_t cp = 0;
    int len = 0;
    if (*p < 0x80) {
      cp = *p;
      len = 1;
    } else if ((*p & 0xE0) == 0xC0 && end - p >= 2) {
      cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      len = 2;
    } else {
      return false;  // every mapped code point is below U+0800
    }
    if (cp >= table.size() || table[cp] < 0) return false;
    out->push_back(char(uint8_t(table[cp])));
    p += len;
  }
  return true;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  LOOM_CHECK(f.good(), "tokenizer", "gpt2 ", what, " not found or unreadable: ", path,
             "; point LOOM_DATA_DIR (or --data-dir) at a folder holding gpt2/encoder.json and "
             "gpt2/vocab.bpe (the repo ships them under data/gpt2)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Open-addressing map from an adjacent id pair to (merge rank, merged id).
class PairTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0, merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  bool insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return false;
      if (slots_[i].key == kEmpty) {
        slots_[i] = {k, rank, merged};
        return true;
      }
    }
  }
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17) & mask_; }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// Reused buffers of the merge loop, so a word allocates nothing once they have grown.
struct BpeScratch {
  struct Sym {
    int32_t id, prev, next;
  };
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> syms;
  std::vector<Cand> heap;
  std::vector<int32_t> touched;
};

constexpr size_t kMaxCachedWord = 64;
constexpr size_t kMaxCacheEntries = size_t(1) << 20;

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::vector<std::string> token_bytes;
  std::unordered_map<std::string, int32_t> id_of;
  int32_t byte_id[256];
  PairTable merges;
  int64_t n_merges = 0;
  std::optional<int32_t> eot;
  mutable std::mutex cache_mu;
  mutable StringMap<std::vector<int32_t>> cache;

  void load(const std::string& dir);
  void bpe(std::string_view word, std::vector<int32_t>& out, BpeScratch& s) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& s, bool use_cache) const;
};

void Gpt2Tokenizer::Impl::load(const std::string& dir) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  const std::string enc_text = read_file(enc_path, "encoder.json");
  const std::string bpe_text = read_file(bpe_path, "vocab.bpe");
  const std::vector<int> table = unicode_to_byte_table();

  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(enc_text);
  } catch (const std::exception& e) {
    fail("tokenizer", enc_path, " is not valid JSON (", e.what(), "); restore it from the repo's data/gpt2");
  }
  LOOM_CHECK(enc.is_object() && !enc.empty(), "tokenizer", enc_path, " must be a JSON object of token -> id");
  token_bytes.assign(enc.size(), std::string());
  std::vector<bool> seen(enc.size(), false);
  std::string raw;
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    LOOM_CHECK(it.value().is_number_integer(), "tokenizer", enc_path, ": id of '", it.key(), "' is not an integer");
    const int64_t id = it.value().get<int64_t>();
    LOOM_CHECK(id >= 0 && id < int64_t(enc.size()) && !seen[size_t(id)], "tokenizer", enc_path, ": ids must be 0..",
               enc.size() - 1, " each once; '", it.key(), "' has ", id);
    seen[size_t(id)] = true;
    if (unmap_token(it.key(), table, &raw)) {
      token_bytes[size_t(id)] = raw;
    } else {
      token_bytes[size_t(id)] = it.key();  // special tokens such as <|endoftext|> are plain ASCII
    }
    id_of.emplace(token_bytes[size_t(id)], int32_t(id));
  }
  if (auto it = enc.find("<|endoftext|>"); it != enc.end()) eot = int32_t(it.value().get<int64_t>());
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, char(uint8_t(b))));
    LOOM_CHECK(it != id_of.end(), "tokenizer", enc_path, " lacks the single-byte token for byte ", b);
    byte_id[b] = it->second;
  }

  std::istringstream lines(bpe_text);
  std::string line, a, b;
  int64_t line_no = 0;
  merges.reserve(enc.size());
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    LOOM_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size(), "tokenizer", bpe_path, " line ", line_no,
               ": expected two tokens separated by a space");
    std::string left, right;
    LOOM_CHECK(unmap_token(line.substr(0, sp), table, &left) && unmap_token(line.substr(sp + 1), table, &right),
               "tokenizer", bpe_path, " line ", line_no, ": not in GPT-2's byte alphabet");
    auto il = id_of.find(left), ir = id_of.find(right), im = id_of.find(left + right);
    LOOM_CHECK(il != id_of.end() && ir != id_of.end() && im != id_of.end(), "tokenizer", bpe_path, " line ", line_no,
               ": merge '", line, "' uses a token missing from encoder.json");
    if (merges.insert(il->second, ir->second, int32_t(n_merges), im->second)) ++n_merges;
  }
  LOOM_CHECK(n_merges > 0, "tokenizer", bpe_path, " holds no merges");
}

void Gpt2Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out, BpeScratch& s) const {
  using Cand = BpeScratch::Cand;
  const int32_t n = int32_t(word.size());
  s.syms.resize(size_t(n));
  s.heap.clear();
  for (int32_t i = 0; i < n; ++i)
    s.syms[size_t(i)] = {byte_id[uint8_t(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};
  auto push_pair = [&](int32_t left_pos) {
    if (left_pos < 0) return;
    const int32_t right_pos = s.syms[size_t(left_pos)].next;
    if (right_pos < 0) return;
    const int32_t a = s.syms[size_t(left_pos)].id, b = s.syms[size_t(right_pos)].id;
    if (const PairTable::Entry* e = merges.find(a, b)) {
      s.heap.push_back({e->rank, left_pos, a, b, e->merged});
      std::push_heap(s.heap.begin(), s.heap.end(), std::greater<Cand>());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!s.heap.empty()) {
    // All occurrences of the lowest-ranked pair, leftmost first; new pairs are added only
    // after the pass, exactly as the reference rebuilds its pair set between passes.
    const int32_t rank = s.heap.front().rank;
    s.touched.clear();
    while (!s.heap.empty() && s.heap.front().rank == rank) {
      std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<Cand>());
      const Cand c = s.heap.back();
      s.heap.pop_back();
      BpeScratch::Sym& left = s.syms[size_t(c.pos)];
      if (left.id != c.left || left.next < 0) continue;  // stale: merged away since queued
      BpeScratch::Sym& right = s.syms[size_t(left.next)];
      if (right.id != c.right) continue;
      left.id = c.merged;
      right.id = -1;
      left.next = right.next;
      if (right.next >= 0) s.syms[size_t(right.next)].prev = c.pos;
      s.touched.push_back(c.pos);
    }
    for (int32_t pos : s.touched) {
      push_pair(s.syms[size_t(pos)].prev);
      push_pair(pos);
    }
  }
  for (int32_t i = 0; i >= 0; i = s.syms[size_t(i)].next) out.push_back(s.syms[size_t(i)].id);
}

void Gpt2Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& s,
                                      bool use_cache) const {
  if (word.size() == 1) {
    out.push_back(byte_id[uint8_t(word[0])]);
    return;
  }
  if (!use_cache || word.size() > kMaxCachedWord) {
    bpe(word, out, s);
    return;
  }
  if (auto it = cache.find(word); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t first = out.size();
  bpe(word, out, s);
  if (cache.size() >= kMaxCacheEntries) cache.clear();  // bound memory on huge corpora
  cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : impl_(std::make_unique<Impl>()) { impl_->load(dir); }
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

int32_t Gpt2Tokenizer::vocab_size() const { return int32_t(impl_->token_bytes.size()); }
std::optional<int32_t> Gpt2Tokenizer::eot_id() const { return impl_->eot; }
int64_t Gpt2Tokenizer::merge_count() const { return impl_->n_merges; }

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  LOOM_CHECK(id >= 0 && id < vocab_size(), "tokenizer", "id ", id, " is outside gpt2's vocabulary (0..",
             vocab_size() - 1, ")");
  return impl_->token_bytes[size_t(id)];
}

void Gpt2Tokenizer::encode_append(std::string_view bytes, std::vector<int32_t>& out) const {
  // The cache is shared; a caller that finds it busy encodes without it rather than waiting.
  std::unique_lock<std::mutex> lock(impl_->cache_mu, std::try_to_lock);
  BpeScratch scratch;
  Gpt2PreTokenizer pt(bytes);
  std::string_view word;
  while (pt.next(&word)) impl_->encode_word(word, out, scratch, lock.owns_lock());
}

void Gpt2Tokenizer::encode_stream(std::string_view bytes, const TokenSink& sink, size_t flush_tokens) const {
  std::unique_lock<std::mutex> lock(impl_->cache_mu, std::try_to_lock);
  BpeScratch scratch;
  Gpt2PreTokenizer pt(bytes);
  std::string_view word;
  std::vector<int32_t> buf;
  buf.reserve(flush_tokens + 1024);
  while (pt.next(&word)) {
    impl_->encode_word(word, buf, scratch, lock.owns_lock());
    if (buf.size() >= flush_tokens) {
      sink(buf, pt.position());
      buf.clear();
    }
  }
  sink(buf, bytes.size());
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  // Two passes (sizes, then copies) so the output is allocated once.
  size_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    LOOM_CHECK(id >= 0 && id < vocab_size(), "tokenizer", "id ", id, " at position ", i,
               " is outside gpt2's vocabulary (0..", vocab_size() - 1, ")");
    total += impl_->token_bytes[size_t(id)].size();
  }
  std::string out(total, '\0');
  char* p = out.data();
  for (int32_t id : ids) {
    const std::string& t = impl_->token_bytes[size_t(id)];
    std::memcpy(p, t.data(), t.size());
    p += t.size();
  }
  return out;
}

}  // namespace loom::data
