// BlockPool bookkeeping: reference counts, the LRU free queue and the prefix-cache map.
#include "loom/infer/block_pool.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/core/rng.h"

namespace loom::infer {

namespace {
// One SplitMix64 step per token.
uint64_t mix(uint64_t x) { return splitmix64_mix(x + 0x9e3779b97f4a7c15ull); }
}  // namespace

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent_hash ^ 0x5851f42d4c957f2dull);
  for (int32_t t : tokens) h = mix(h ^ uint64_t(uint32_t(t)));
  return mix(h ^ uint64_t(tokens.size()));
}

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size)
    : block_size_(block_size),
      ref_(size_t(num_blocks), 0),
      meta_(size_t(num_blocks)),
      prev_(size_t(num_blocks), -1),
      next_(size_t(num_blocks), -1) {
  LOOM_CHECK(num_blocks > 0, "kv", "the KV cache needs at least one block, got ", num_blocks);
  LOOM_CHECK(block_size > 0, "kv", "block_size must be positive, got ", block_size);
  LOOM_CHECK(num_blocks < (int64_t(1) << 31), "kv", "num_blocks=", num_blocks, " does not fit 32-bit block ids");
  for (int32_t b = 0; b < int32_t(num_blocks); ++b) queue_push_back(b);
}

void BlockPool::queue_push_back(int32_t b) {
  prev_[size_t(b)] = tail_;
  next_[size_t(b)] = -1;
  if (tail_ >= 0)
    next_[size_t(tail_)] = b;
  else
    head_ = b;
  tail_ = b;
  ++free_count_;
}

void BlockPool::queue_remove(int32_t b) {
  const int32_t p = prev_[size_t(b)], n = next_[size_t(b)];
  if (p >= 0)
    next_[size_t(p)] = n;
  else
    head_ = n;
  if (n >= 0)
    prev_[size_t(n)] = p;
  else
    tail_ = p;
  prev_[size_t(b)] = next_[size_t(b)] = -1;
  --free_count_;
}

void BlockPool::uncache(int32_t b) {
  Meta& m = meta_[size_t(b)];
  if (!m.cached) return;
  auto it = cache_.find(m.hash);
  if (it != cache_.end() && it->second == b) cache_.erase(it);
  m.cached = false;
  m.tokens.clear();
}

std::optional<int32_t> BlockPool::allocate() {
  if (head_ < 0) return std::nullopt;
  const int32_t b = head_;
  queue_remove(b);
  if (meta_[size_t(b)].cached) {
    uncache(b);
    ++evictions_;
  }
  ref_[size_t(b)] = 1;
  return b;
}

void BlockPool::incref(int32_t b) {
  if (ref_[size_t(b)]++ == 0) queue_remove(b);  // unreferenced blocks are exactly the queued ones
}

void BlockPool::decref(int32_t b) {
  LOOM_CHECK(ref_[size_t(b)] > 0, "kv", "block ", b, " freed more often than it was referenced");
  if (--ref_[size_t(b)] == 0) queue_push_back(b);
}

std::optional<int32_t> BlockPool::lookup(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return std::nullopt;
  const Meta& m = meta_[size_t(it->second)];
  if (m.parent != parent_hash || !std::equal(tokens.begin(), tokens.end(), m.tokens.begin(), m.tokens.end()))
    return std::nullopt;
  return it->second;
}

void BlockPool::cache(int32_t b, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) {
  if (meta_[size_t(b)].cached || cache_.count(hash)) return;
  Meta& m = meta_[size_t(b)];
  m.cached = true;
  m.hash = hash;
  m.parent = parent_hash;
  m.tokens.assign(tokens.begin(), tokens.end());
  cache_.emplace(hash, b);
}

}  // namespace loom::infer
