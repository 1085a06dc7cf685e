// BlockPool and KVCacheManager as data: reference counts, the LRU free queue and eviction,
// prefix-cache hits, copy-on-write, and every block returning to the pool.
#include <gtest/gtest.h>

#include <numeric>

#include "loom/infer/block_pool.h"
#include "loom/infer/kv_manager.h"

using namespace loom::infer;

namespace {
std::vector<int32_t> iota_tokens(int n, int first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}
}  // namespace

TEST(BlockPool, AllocatesUntilEmptyAndReturnsBlocks) {
  BlockPool pool(3, 4);
  EXPECT_EQ(pool.num_free(), 3);
  auto a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0);  // FIFO order from a fresh pool
  EXPECT_EQ(*c, 2);
  EXPECT_FALSE(pool.allocate().has_value());
  EXPECT_EQ(pool.num_used(), 3);
  pool.incref(*b);
  pool.decref(*b);
  EXPECT_EQ(pool.ref_count(*b), 1);
  EXPECT_EQ(pool.num_free(), 0);
  pool.decref(*b);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(*pool.allocate(), *b);
  pool.decref(*a);
  EXPECT_THROW(pool.decref(*a), std::exception) << "a double free is caught";
}

TEST(BlockPool, CachedBlocksAreFoundAndEvictedLeastRecentlyUsed) {
  BlockPool pool(3, 2);
  const std::vector<int32_t> t0{1, 2}, t1{3, 4};
  const uint64_t h0 = hash_block(kNoParent, t0), h1 = hash_block(h0, t1);
  EXPECT_NE(h0, h1);
  EXPECT_NE(hash_block(kNoParent, t1), h1) << "the parent is part of the key";
  const int32_t b0 = *pool.allocate(), b1 = *pool.allocate();
  pool.cache(b0, h0, kNoParent, t0);
  pool.cache(b1, h1, h0, t1);
  EXPECT_EQ(pool.num_cached(), 2);
  EXPECT_EQ(pool.lookup(h0, kNoParent, t0), b0);
  EXPECT_FALSE(pool.lookup(h0, kNoParent, t1).has_value()) << "tokens are verified";
  pool.decref(b1);  // b1 freed first, then b0: b1 is the least recently used
  pool.decref(b0);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_cached(), 2) << "freed blocks stay cached until reused";
  // Touching b0 takes it off the free queue.
  pool.incref(b0);
  EXPECT_EQ(pool.num_free(), 2);
  pool.decref(b0);
  // Block 2 was never used, so it goes first; then b1 (older), evicting its entry.
  EXPECT_EQ(*pool.allocate(), 2);
  EXPECT_EQ(*pool.allocate(), b1);
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_FALSE(pool.lookup(h1, h0, t1).has_value());
  EXPECT_EQ(pool.lookup(h0, kNoParent, t0), b0);
}

TEST(KVCacheManager, AllocatesBlocksAsTokensGrow) {
  KVCacheManager kv(8, 4, true);
  auto a = kv.allocate_slots(7, 0, 6);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->new_blocks.size(), 2u);
  EXPECT_TRUE(a->copies.empty());
  EXPECT_EQ(kv.block_table(7).size(), 2u);
  EXPECT_TRUE(kv.allocate_slots(7, 6, 2)->new_blocks.empty()) << "slots 6,7 fit block 1";
  EXPECT_EQ(kv.allocate_slots(7, 8, 1)->new_blocks.size(), 1u);
  EXPECT_FALSE(kv.allocate_slots(9, 0, 21).has_value()) << "needs 6 blocks, 5 are free";
  EXPECT_EQ(kv.pool().num_free(), 5) << "a refused allocation changes nothing";
  kv.release(7);
  EXPECT_EQ(kv.pool().num_free(), 8);
}

TEST(KVCacheManager, SharedPrefixBlocksAreReferenceCounted) {
  KVCacheManager kv(10, 4, true);
  const auto prompt = iota_tokens(10);  // blocks [0..3] [4..7] and a partial [8, 9]
  ASSERT_TRUE(kv.allocate_slots(1, 0, 10));
  EXPECT_TRUE(kv.find_cached_prefix(2, prompt).empty()) << "nothing cached before compute";
  kv.cache_full_blocks(1, prompt, 10);
  auto other = prompt;
  other[9] = 99;  // same first 8 tokens
  const auto hit = kv.find_cached_prefix(2, other);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], kv.block_table(1)[0]);
  EXPECT_EQ(hit[1], kv.block_table(1)[1]);
  const int64_t free_before = kv.pool().num_free();
  auto a = kv.allocate_slots(2, 8, 2, hit);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->new_blocks.size(), 1u) << "only the partial third block is new";
  EXPECT_TRUE(a->copies.empty());
  EXPECT_EQ(kv.pool().num_free(), free_before - 1);
  EXPECT_EQ(kv.pool().ref_count(hit[0]), 2);
  // A prompt diverging inside the second block shares only the first.
  auto diverged = prompt;
  diverged[5] = 77;
  EXPECT_EQ(kv.find_cached_prefix(3, diverged).size(), 1u);
  kv.release(1);
  EXPECT_EQ(kv.pool().ref_count(hit[0]), 1);
  kv.release(2);
  kv.release(3);
  EXPECT_EQ(kv.pool().num_free(), 10);
  EXPECT_EQ(kv.num_sequences(), 0);
}

TEST(KVCacheManager, WritingIntoASharedBlockCopiesItFirst) {
  KVCacheManager kv(6, 4, true);
  const auto prompt = iota_tokens(8);  // exactly two full blocks
  ASSERT_TRUE(kv.allocate_slots(1, 0, 8));
  kv.cache_full_blocks(1, prompt, 8);
  const auto hit = kv.find_cached_prefix(2, prompt);
  ASSERT_EQ(hit.size(), 2u);
  // The whole prompt is cached; the last token is recomputed for its logits, which writes
  // slot 7 of the shared second block: that block must be copied, not overwritten.
  EXPECT_EQ(kv.blocks_needed(2, 7, 1, hit), 1);
  auto a = kv.allocate_slots(2, 7, 1, hit);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->copies.size(), 1u);
  EXPECT_EQ(a->copies[0].src, hit[1]);
  EXPECT_EQ(a->copies[0].dst, kv.block_table(2)[1]);
  EXPECT_NE(kv.block_table(2)[1], hit[1]);
  EXPECT_EQ(kv.block_table(2)[0], hit[0]) << "the untouched block stays shared";
  EXPECT_EQ(kv.pool().ref_count(hit[1]), 1);
  EXPECT_EQ(kv.pool().ref_count(hit[0]), 2);
  // Sequence 2's next token opens a fresh block; nothing else is copied.
  auto b = kv.allocate_slots(2, 8, 1);
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->copies.empty());
  kv.release(1);
  kv.release(2);
  EXPECT_EQ(kv.pool().num_free(), 6);
}

TEST(KVCacheManager, FreedSequenceTailIsEvictedBeforeItsHead) {
  KVCacheManager kv(3, 2, true);
  const auto prompt = iota_tokens(6);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 6));
  kv.cache_full_blocks(1, prompt, 6);
  const auto table = kv.block_table(1);
  kv.free(1);
  // One new block evicts the sequence's last block; its first two stay findable.
  ASSERT_TRUE(kv.allocate_slots(2, 0, 1));
  EXPECT_EQ(kv.block_table(2)[0], table[2]);
  EXPECT_EQ(kv.find_cached_prefix(1, prompt).size(), 2u);
}
