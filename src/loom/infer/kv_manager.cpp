// KVCacheManager: block tables, prefix hits, copy-on-write and freeing over the BlockPool.
#include "loom/infer/kv_manager.h"

#include "loom/core/error.h"

namespace loom::infer {

KVCacheManager::KVCacheManager(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : pool_(num_blocks, block_size), prefix_caching_(prefix_caching) {}

void KVCacheManager::extend_hashes(SeqKV& s, std::span<const int32_t> tokens, int64_t n_blocks) const {
  const int64_t bs = block_size();
  while (int64_t(s.hashes.size()) < n_blocks) {
    const int64_t i = int64_t(s.hashes.size());
    const uint64_t parent = i == 0 ? kNoParent : s.hashes.back();
    s.hashes.push_back(hash_block(parent, tokens.subspan(size_t(i * bs), size_t(bs))));
  }
}

std::vector<int32_t> KVCacheManager::find_cached_prefix(int64_t seq, std::span<const int32_t> tokens) {
  std::vector<int32_t> hit;
  if (!prefix_caching_) return hit;
  const int64_t bs = block_size(), full = int64_t(tokens.size()) / bs;
  SeqKV& s = seqs_[seq];
  extend_hashes(s, tokens, full);
  for (int64_t i = 0; i < full; ++i) {
    const uint64_t parent = i == 0 ? kNoParent : s.hashes[size_t(i - 1)];
    auto b = pool_.lookup(s.hashes[size_t(i)], parent, tokens.subspan(size_t(i * bs), size_t(bs)));
    if (!b) break;
    hit.push_back(*b);
  }
  return hit;
}

bool KVCacheManager::needs_copy(int32_t block) const {
  // A shared block belongs to others too; a cached one promises its content to future hits.
  return pool_.ref_count(block) > 1 || pool_.is_cached(block);
}

int64_t KVCacheManager::blocks_needed(int64_t seq, int64_t num_computed, int64_t num_new,
                                      std::span<const int32_t> prefix) const {
  const int64_t bs = block_size();
  auto it = seqs_.find(seq);
  int64_t have = it == seqs_.end() ? 0 : int64_t(it->second.table.size());
  int64_t taken = 0;
  bool adopting = have == 0 && !prefix.empty();
  if (adopting) {
    have = int64_t(prefix.size());
    for (int32_t b : prefix) taken += pool_.ref_count(b) == 0 ? 1 : 0;
  }
  const int64_t want = (num_computed + num_new + bs - 1) / bs;
  taken += std::max<int64_t>(0, want - have);
  const int64_t first = num_computed / bs;
  if (num_new > 0 && first < have) {
    const int32_t b = adopting ? prefix[size_t(first)] : it->second.table[size_t(first)];
    // An adopted block with no other holder is still cached, hence copied as well.
    if (adopting || needs_copy(b)) taken += 1;
  }
  return taken;
}

std::optional<SlotAllocation> KVCacheManager::allocate_slots(int64_t seq, int64_t num_computed, int64_t num_new,
                                                             std::span<const int32_t> prefix) {
  if (blocks_needed(seq, num_computed, num_new, prefix) > pool_.num_free()) return std::nullopt;
  const int64_t bs = block_size();
  SeqKV& s = seqs_[seq];
  SlotAllocation out;
  if (s.table.empty() && !prefix.empty()) {
    LOOM_CHECK(num_computed <= int64_t(prefix.size()) * bs, "kv", "sequence ", seq, " starts at token ", num_computed,
               " beyond its cached prefix of ", prefix.size() * size_t(bs), " tokens");
    for (int32_t b : prefix) {
      pool_.incref(b);
      s.table.push_back(b);
    }
    s.num_cached_blocks = int64_t(prefix.size());
  }
  const int64_t first = num_computed / bs;
  if (num_new > 0 && first < int64_t(s.table.size()) && needs_copy(s.table[size_t(first)])) {
    const int32_t src = s.table[size_t(first)];
    const int32_t dst = *pool_.allocate();
    out.copies.push_back({src, dst});
    out.new_blocks.push_back(dst);
    s.table[size_t(first)] = dst;
    pool_.decref(src);
    // The copy is partly rewritten, so it must not be re-offered to the cache as it stands.
    s.num_cached_blocks = std::min(s.num_cached_blocks, first);
  }
  const int64_t want = (num_computed + num_new + bs - 1) / bs;
  while (int64_t(s.table.size()) < want) {
    const int32_t b = *pool_.allocate();
    s.table.push_back(b);
    out.new_blocks.push_back(b);
  }
  return out;
}

void KVCacheManager::cache_full_blocks(int64_t seq, std::span<const int32_t> tokens, int64_t num_computed) {
  if (!prefix_caching_) return;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqKV& s = it->second;
  const int64_t bs = block_size();
  const int64_t full = std::min<int64_t>(num_computed / bs, int64_t(s.table.size()));
  extend_hashes(s, tokens, full);
  for (int64_t i = s.num_cached_blocks; i < full; ++i) {
    const uint64_t parent = i == 0 ? kNoParent : s.hashes[size_t(i - 1)];
    pool_.cache(s.table[size_t(i)], s.hashes[size_t(i)], parent, tokens.subspan(size_t(i * bs), size_t(bs)));
  }
  s.num_cached_blocks = std::max(s.num_cached_blocks, full);
}

std::vector<int32_t> KVCacheManager::free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  std::vector<int32_t> freed;
  auto& t = it->second.table;
  for (auto b = t.rbegin(); b != t.rend(); ++b) {
    pool_.decref(*b);
    freed.push_back(*b);
  }
  t.clear();
  it->second.num_cached_blocks = 0;
  return freed;
}

std::vector<int32_t> KVCacheManager::release(int64_t seq) {
  auto freed = free(seq);
  seqs_.erase(seq);
  return freed;
}

std::vector<int32_t> KVCacheManager::truncate(int64_t seq, int64_t num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  SeqKV& s = it->second;
  const int64_t bs = block_size();
  const size_t keep = size_t((num_tokens + bs - 1) / bs);
  std::vector<int32_t> freed;
  while (s.table.size() > keep) {
    pool_.decref(s.table.back());
    freed.push_back(s.table.back());
    s.table.pop_back();
  }
  const size_t full = size_t(num_tokens / bs);
  if (s.hashes.size() > full) s.hashes.resize(full);
  s.num_cached_blocks = std::min(s.num_cached_blocks, int64_t(full));
  return freed;
}

const std::vector<int32_t>& KVCacheManager::block_table(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? empty_ : it->second.table;
}

}  // namespace loom::infer
