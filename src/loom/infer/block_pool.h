// BlockPool: the metadata of the paged KV cache (no tensors): fixed-size blocks with reference
// counts, an LRU free queue, and a prefix cache that maps a full block's content hash
// (previous block's hash, its token IDs) to the block holding its K/V. Unreferenced cached
// blocks stay in the free queue and are evicted least-recently-used when allocated over.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace loom::infer {

// Hash of a full block given its predecessor's hash (kNoParent for the first block).
inline constexpr uint64_t kNoParent = 0x6a09e667f3bcc908ull;
uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens);

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return int64_t(ref_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks no sequence references (including evictable cached ones).
  int64_t num_free() const { return free_count_; }
  int64_t num_used() const { return num_blocks() - free_count_; }
  int64_t num_cached() const { return int64_t(cache_.size()); }
  int64_t num_evictions() const { return evictions_; }

  // Takes the least-recently-freed block (evicting its cache entry) with reference count 1;
  // nullopt when every block is referenced.
  std::optional<int32_t> allocate();
  // One more reference; a free (cached) block leaves the free queue.
  void incref(int32_t block);
  // One fewer reference; at zero the block joins the back of the free queue (still cached).
  void decref(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[size_t(block)]; }

  // The cached block with this content, if any.
  std::optional<int32_t> lookup(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const;
  // Registers a full, computed block. No-op when an equal block is already cached.
  void cache(int32_t block, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);
  bool is_cached(int32_t block) const { return meta_[size_t(block)].cached; }

 private:
  struct Meta {
    bool cached = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;  // verified on lookup so a hash collision cannot alias
  };
  void queue_push_back(int32_t b);
  void queue_remove(int32_t b);
  void uncache(int32_t b);

  int64_t block_size_;
  std::vector<int32_t> ref_;
  std::vector<Meta> meta_;
  // Intrusive doubly linked free queue over block ids; -1 ends it.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = -1, tail_ = -1;
  int64_t free_count_ = 0;
  int64_t evictions_ = 0;
  std::unordered_map<uint64_t, int32_t> cache_;
};

}  // namespace loom::infer
