// KVCache tensors: allocation (zeroed, so unused slots never hold NaN garbage) and
// block copies.
#include "loom/infer/kv_cache.h"

#include "loom/kernels/cpu/paged_attention.h"

namespace loom::infer {

KVCache::KVCache(const model::ModelConfig& cfg, int64_t num_blocks, int64_t block_size, DType dtype, Allocator& alloc)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      block_elems_(cfg.n_kv_head * block_size * cfg.head_dim()),
      dtype_(dtype) {
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::f64, "kv", "the KV cache supports f32 (and f64 for checks), got ",
             dtype_name(dtype));
  const Shape shape{num_blocks, cfg.n_kv_head, block_size, cfg.head_dim()};
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    k_.push_back(Tensor::zeros(shape, dtype, MemCategory::kv_cache, alloc));
    v_.push_back(Tensor::zeros(shape, dtype, MemCategory::kv_cache, alloc));
  }
}

int64_t KVCache::bytes_per_block(const model::ModelConfig& cfg, int64_t block_size, DType dtype) {
  return 2 * cfg.n_layer * cfg.n_kv_head * block_size * cfg.head_dim() * int64_t(dtype_size(dtype));
}

int64_t KVCache::bytes() const {
  int64_t b = 0;
  for (const auto& t : k_) b += int64_t(t.nbytes());
  for (const auto& t : v_) b += int64_t(t.nbytes());
  return b;
}

void KVCache::copy_blocks(const std::vector<BlockCopy>& copies) {
  if (copies.empty()) return;
  src_.clear();
  dst_.clear();
  for (const auto& c : copies) {
    src_.push_back(c.src);
    dst_.push_back(c.dst);
  }
  const int64_t n = int64_t(copies.size());
  for (size_t l = 0; l < k_.size(); ++l)
    for (const Tensor* t : {&k_[l], &v_[l]}) {
      if (dtype_ == DType::f32)
        cpu::paged_block_copy(t->data<float>(), src_.data(), dst_.data(), n, block_elems_);
      else
        cpu::paged_block_copy(t->data<double>(), src_.data(), dst_.data(), n, block_elems_);
    }
}

}  // namespace loom::infer
