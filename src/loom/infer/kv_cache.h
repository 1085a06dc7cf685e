// KVCache: the K and V tensors of the paged cache, one pair per layer, each
// [num_blocks, n_kv_head, block_size, head_dim] (category kv_cache). Which block belongs to
// whom is the BlockPool's business; this only holds the numbers.
#pragma once
#include <cstdint>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/infer/kv_manager.h"
#include "loom/model/config.h"

namespace loom::infer {

class KVCache {
 public:
  KVCache(const model::ModelConfig& cfg, int64_t num_blocks, int64_t block_size, DType dtype,
          Allocator& alloc = cpu_allocator());

  // Bytes of K and V over all layers for one block (or one token).
  static int64_t bytes_per_block(const model::ModelConfig& cfg, int64_t block_size, DType dtype);
  // Blocks that hold one sequence of `tokens` tokens (whole blocks).
  static int64_t blocks_for_tokens(int64_t tokens, int64_t block_size) {
    return (tokens + block_size - 1) / block_size;
  }

  const Tensor& k(int layer) const { return k_[size_t(layer)]; }
  const Tensor& v(int layer) const { return v_[size_t(layer)]; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  DType dtype() const { return dtype_; }
  int64_t bytes() const;

  // Copy-on-write: block dst takes block src's K and V in every layer.
  void copy_blocks(const std::vector<BlockCopy>& copies);

 private:
  int64_t num_blocks_, block_size_, block_elems_;
  DType dtype_;
  std::vector<Tensor> k_, v_;
  std::vector<int32_t> src_, dst_;
};

}  // namespace loom::infer
