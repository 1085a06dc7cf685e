// KVCacheManager: per-sequence block tables over a BlockPool, prefix-cache lookups, slot
// allocation with copy-on-write, and freeing. Metadata only: the copies it asks for are
// carried out on the KV tensors by the model runner.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/infer/block_pool.h"

namespace loom::infer {

// A block copy the runner must perform before the step writes into `dst`.
struct BlockCopy {
  int32_t src = -1, dst = -1;
  bool operator==(const BlockCopy&) const = default;
};

struct SlotAllocation {
  std::vector<int32_t> new_blocks;  // appended to the table or replacing a shared block
  std::vector<BlockCopy> copies;
};

class KVCacheManager {
 public:
  KVCacheManager(int64_t num_blocks, int64_t block_size, bool prefix_caching);

  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  int64_t block_size() const { return pool_.block_size(); }
  bool prefix_caching() const { return prefix_caching_; }

  // Cached blocks holding the longest prefix of `tokens` made of whole blocks.
  std::vector<int32_t> find_cached_prefix(int64_t seq, std::span<const int32_t> tokens);

  // Makes room for seq to write tokens [num_computed, num_computed + num_new). A sequence
  // without blocks first adopts `prefix` (from find_cached_prefix; num_computed must lie
  // within it). A block about to be written that is shared or cached is copied first.
  // Returns nullopt, changing nothing, when the pool is short of free blocks.
  std::optional<SlotAllocation> allocate_slots(int64_t seq, int64_t num_computed, int64_t num_new,
                                               std::span<const int32_t> prefix = {});
  // Blocks the allocation above would take from the free queue.
  int64_t blocks_needed(int64_t seq, int64_t num_computed, int64_t num_new, std::span<const int32_t> prefix = {}) const;

  // Offers seq's full blocks among its first num_computed tokens to the prefix cache.
  void cache_full_blocks(int64_t seq, std::span<const int32_t> tokens, int64_t num_computed);

  // Releases seq's blocks, tail first (so a sequence's tail is evicted before its head), and
  // returns them. The sequence's token hashes are kept for a later re-admission.
  std::vector<int32_t> free(int64_t seq);
  // free() and forget the sequence entirely.
  std::vector<int32_t> release(int64_t seq);
  // Keeps the blocks that hold seq's first num_tokens tokens and releases the rest, tail
  // first (speculative tokens the target rejected); hashes beyond them are forgotten.
  std::vector<int32_t> truncate(int64_t seq, int64_t num_tokens);

  const std::vector<int32_t>& block_table(int64_t seq) const;
  int64_t num_sequences() const { return int64_t(seqs_.size()); }

 private:
  struct SeqKV {
    std::vector<int32_t> table;
    std::vector<uint64_t> hashes;   // of the full blocks of its tokens seen so far
    int64_t num_cached_blocks = 0;  // leading blocks already offered to the cache
  };
  void extend_hashes(SeqKV& s, std::span<const int32_t> tokens, int64_t n_blocks) const;
  bool needs_copy(int32_t block) const;

  BlockPool pool_;
  bool prefix_caching_;
  std::unordered_map<int64_t, SeqKV> seqs_;
  std::vector<int32_t> empty_;
};

}  // namespace loom::infer
